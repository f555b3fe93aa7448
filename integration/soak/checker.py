"""The soak's verdict. Per producing client: acknowledged records lost, duplicates, order violations, acknowledged
offsets that are wrong, acknowledged records the group never received, partitions whose committed offset never
reached the end (a stuck consumer), and committed offsets that went backwards. Per consuming client (a member of
the group): the records left behind the committed offset of partitions it owned at the end, committed offsets that
fell back to one it committed, and partitions it committed in a generation in which another member committed them
too."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from integration.idem_raw import StoredRecord
from integration.idem_stream import StreamCheck, check_stream
from integration.soak.consumers import GroupMember, TopicPartition
from integration.soak.producers import StreamProducer


@dataclass(frozen=True, slots=True)
class ClientVerdict:
    client: str
    stream: StreamCheck
    unreceived: int  # acknowledged, stored, and never delivered to the group
    stuck: list[int]  # partitions whose committed offset stayed behind the end
    backwards: list[tuple[int, int, int]]  # partition, from, to
    producer_error: str | None
    # the first values stored more than once, each copy as (partition, offset, producer epoch, sequence), and the
    # offset its delivery report acknowledged: to tell from the report alone which write stored it again
    copies: list[tuple[bytes, list[tuple[int, int, int, int]], int | None]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        s = self.stream
        return not (s.lost or s.duplicated or s.out_of_order or s.offset_mismatches or s.foreign or self.unreceived
                    or self.stuck or self.backwards or self.producer_error)

    def summary(self) -> str:
        return (f"{self.client:<13} {'ok  ' if self.ok else 'FAIL'} {self.stream.summary()} "
                f"unreceived={self.unreceived} stuck={self.stuck} backwards={self.backwards}"
                + (f" producer_error={self.producer_error}" if self.producer_error else "")
                + (f" copies={self.copies}" if self.copies else ""))


def judge(producer: StreamProducer, stored: list[StoredRecord], received: set[bytes], committed: dict[int, int],
          ends: dict[int, int], backwards: list[tuple[int, int, int]]) -> ClientVerdict:
    stream = check_stream(producer.sent, producer.reports, stored)
    stored_values = {r.value for r in stored}
    unreceived = sum(1 for r in producer.reports if r.error is None and r.value in stored_values
                     and r.value not in received)
    stuck = sorted(p for p, end in ends.items() if committed.get(p, -1) < end)
    return ClientVerdict(producer.name_prefix, stream, unreceived, stuck, backwards,
                         None if producer.error is None else repr(producer.error), stored_twice(producer, stored))


def stored_twice(producer: StreamProducer, stored: list[StoredRecord], limit: int = 5
                 ) -> list[tuple[bytes, list[tuple[int, int, int, int]], int | None]]:
    """The first `limit` values stored more than once: their copies and the offset their report acknowledged."""
    copies: dict[bytes, list[StoredRecord]] = defaultdict(list)
    for record in stored:
        copies[record.value].append(record)
    acked = {r.value: r.offset for r in producer.reports if r.error is None}
    twice = [(value, [(r.partition, r.offset, r.producer_epoch, r.sequence) for r in records], acked.get(value))
             for value, records in copies.items() if len(records) > 1]
    return twice[:limit]


@dataclass(frozen=True, slots=True)
class ConsumerVerdict:
    """One consuming client's part of the group."""

    client: str
    consumed: int  # distinct values it received
    commits: int
    generations: int  # distinct generations it committed in: 0 means the shared-commit check could not tell
    commit_errors: int
    poll_errors: int
    rebalances: int  # assignments beyond its first
    stuck: dict[TopicPartition, int]  # partitions it owned at the end: records behind the group's committed offset
    backwards: list[tuple[TopicPartition, int, int]]  # the group's offset fell from, to an offset this one committed
    shared: list[tuple[TopicPartition, int, str]]  # partition, generation, the other member that committed it then
    error: str | None
    # for each partition in `backwards`: the group's commits of it around the fall, (client, generation, offset),
    # in the order they were answered, to tell a zombie's commit from a stale position in a later generation
    trail: dict[TopicPartition, list[tuple[str, int, int]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.stuck or self.backwards or self.shared or self.error)

    def summary(self) -> str:
        return (f"{'group/' + self.client:<19} {'ok  ' if self.ok else 'FAIL'} consumed={self.consumed} "
                f"commits={self.commits} generations={self.generations} commit_errors={self.commit_errors} "
                f"poll_errors={self.poll_errors} rebalances={self.rebalances} "
                f"stuck={self.stuck} backwards={self.backwards} shared={self.shared}"
                + (f" error={self.error}" if self.error else "")
                + (f" trail={self.trail}" if self.trail else ""))


def judge_members(members: list[GroupMember], latest: dict[TopicPartition, int],
                  ends: dict[TopicPartition, int],
                  backwards: list[tuple[str, int, int, int]]) -> list[ConsumerVerdict]:
    """latest: the group's committed offsets at the end; backwards: the watcher's (topic, partition, from, to)."""
    committers: dict[tuple[TopicPartition, int], set[str]] = defaultdict(set)
    for member in members:
        for mark in member.commits:
            if mark.generation >= 0:
                for tp in mark.offsets:
                    committers[(tp, mark.generation)].add(member.client)
    verdicts = []
    for member in members:
        committed_to = {(tp, o) for mark in member.commits for tp, o in mark.offsets.items()}
        stuck = {tp: ends[tp] - latest.get(tp, 0) for tp in sorted(member.final_owned)
                 if latest.get(tp, -1) < ends.get(tp, 0)}
        fell = [((t, p), a, b) for t, p, a, b in backwards if ((t, p), b) in committed_to]
        shared = sorted((tp, generation, other) for (tp, generation), clients in committers.items()
                        if member.client in clients for other in clients - {member.client})
        generations = {mark.generation for mark in member.commits if mark.generation >= 0}
        verdicts.append(ConsumerVerdict(
            member.client, len(member.received), len(member.commits), len(generations), member.commit_errors,
            member.poll_errors, max(0, member.assignments - 1), stuck, fell, shared,
            None if member.error is None else repr(member.error),
            {tp: commit_trail(members, tp, to) for tp, _, to in fell}))
    return verdicts


def commit_trail(members: list[GroupMember], tp: TopicPartition, fell_to: int, around: int = 4
                 ) -> list[tuple[str, int, int]]:
    """The group's commits of one partition, (client, generation, offset) in the order they were answered: the
    `around` before the first commit of `fell_to` and the `around` after it."""
    marks = sorted((mark.wall, member.client, mark.generation, mark.offsets[tp])
                   for member in members for mark in member.commits if tp in mark.offsets)
    at = next((i for i, (_, _, _, offset) in enumerate(marks) if offset == fell_to), len(marks))
    return [(client, generation, offset) for _, client, generation, offset in marks[max(0, at - around):at + around]]
