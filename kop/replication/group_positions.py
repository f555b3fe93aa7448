"""Where the PIP-33 replicated groups are on a partition, and moving one there on an UPDATE, whichever broker of the
cluster coordinates it.

One broker coordinates every group. In a cluster of brokers on PostgreSQL a group's coordinator is the owner of its
`__consumer_offsets` shard, usually not the broker that owns the partition, which takes the snapshots and stores the
UPDATEs. So the partition's owner reads the offsets of the replicated groups from every other broker once per
snapshot period (ReplicatedGroupOffsets, kop/cluster/replicated_groups.py) and keeps the last answer of each; an
answer that does not come keeps the one before (an older durable offset only delays an UPDATE). An UPDATE for a
group coordinated elsewhere goes to its coordinator (MoveReplicatedGroup): first where the group is, then the move,
made only if the group is still there, so a commit of its own in between is never overwritten by an older
position."""
import logging
from dataclasses import dataclass
from typing import Protocol

from kop.groups import GroupCoordinator
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Wanted = dict[str, tuple[bool, list[int]]]  # topic -> (its policy replicates every group, the partitions)
Seen = dict[TopicPartition, dict[str, int]]  # partition -> group -> committed offset


@dataclass(frozen=True, slots=True)
class GroupPosition:
    """A coordinator's answer: an error, or where the group is on the partition (its latest commit, one still being
    written included; None: no offset there) and whether the request moved it there."""
    error: ErrorCode
    offset: int | None = None
    moved: bool = False


async def move_here(groups: GroupCoordinator, group: str, topic: str, partition: int, offset: int | None,
                    expected: int | None) -> GroupPosition:
    """As the group's coordinator: where the group is, moved first to `offset` (if given) when it is still at
    `expected` and below `offset`; a group the move creates is a replicated one, as Pulsar creates it."""
    error = groups.check(group)
    if error is not None:
        return GroupPosition(error)
    current = groups.newest_offset(group, topic, partition)
    if offset is None or current != expected or (current is not None and current >= offset):
        return GroupPosition(ErrorCode.NONE, current)
    groups.offsets.replicated.add(group)
    outcome = await groups.commit(group, topic, partition, offset)
    if outcome != ErrorCode.NONE:
        return GroupPosition(outcome, current)
    return GroupPosition(ErrorCode.NONE, offset, moved=True)


class Coordinators(Protocol):
    """The other brokers of a cluster, as group coordinators (kop/cluster/replicated_groups.py)."""

    async def offsets_on(self, wanted: Wanted, previous: dict[int, Seen]) -> dict[int, Seen]:
        """Each other live broker's replicated groups on the partitions `wanted`, by node id (a broker that did
        not answer: its previous answer)."""

    async def move(self, group: str, topic: str, partition: int, offset: int | None,
                   expected: int | None) -> GroupPosition:
        """move_here, by the group's coordinator."""


class GroupPositions:
    def __init__(self, groups: GroupCoordinator) -> None:
        self.groups = groups
        self.others: Coordinators | None = None  # in a cluster of brokers
        self._seen: dict[int, Seen] = {}  # node id -> its last answer

    def replicated_on(self, topic: str, partition: int, every: bool) -> dict[str, int]:
        """The committed offsets on the partition of the replicated groups (of every group when `every`), those
        this broker coordinates and those the other brokers last told."""
        found = dict(self.groups.replicated_on(topic, partition, every))
        for seen in self._seen.values():
            for group, offset in seen.get((topic, partition), {}).items():
                if offset > found.get(group, -1):  # a group whose shard moved may be in two answers for a while
                    found[group] = offset
        return found

    async def refresh(self, wanted: Wanted) -> None:
        """Ask the other brokers again (once per snapshot period)."""
        if self.others is not None and wanted:
            self._seen = await self.others.offsets_on(wanted, self._seen)

    async def where(self, group: str, topic: str, partition: int) -> GroupPosition:
        return await self.move(group, topic, partition, None, None)

    async def move(self, group: str, topic: str, partition: int, offset: int | None,
                   expected: int | None) -> GroupPosition:
        found = await move_here(self.groups, group, topic, partition, offset, expected)
        if found.error == ErrorCode.NOT_COORDINATOR and self.others is not None:
            return await self.others.move(group, topic, partition, offset, expected)
        return found
