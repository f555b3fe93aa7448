"""Group members, one per client library, that commit after every batch, and a watcher of the group's committed
offsets.

All members join one group over every soak topic with the range assignor (the protocol the four clients share), so
the group coordinator balances members of different client libraries against each other. A member records every
value it receives, how often it was assigned partitions (a rebalance after a fault is the control that the group
noticed it), what it owned when told to stop, and each successful commit with the generation it was made in: two
members committing one partition in the same generation means both consumed it then (the eager protocol gives each
partition one owner per generation). The watcher reads the committed offsets once a second and records every one
that moved backwards: a member that lost its partitions must not commit behind the member that took them over.
"""
from __future__ import annotations

import abc
import asyncio
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

from integration.java_client import java_available, java_group_consume

SESSION_TIMEOUT_MS = 6000  # the broker's default minimum: a pause longer than this expires every member
HEARTBEAT_MS = 1000
BATCH = 500
POLL_S = 0.5

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CommitMark:
    """One commit the broker accepted."""

    generation: int  # the member's generation when it committed; -1 when it had none
    offsets: dict[TopicPartition, int]  # next offset to read
    wall: float  # time.time() when it was answered


class GroupMember(threading.Thread, abc.ABC):
    """Consumes `topics` in `group` until stop() or `lifetime` seconds; after each batch commits the offsets past
    what it read of each partition since its last commit."""

    client = ""

    def __init__(self, bootstrap: str, group: str, topics: Iterable[str], name: str, lifetime: float) -> None:
        super().__init__(name=f"member-{name}", daemon=True)
        self.bootstrap, self.group, self.topics, self.member = bootstrap, group, list(topics), name
        self.deadline = time.monotonic() + lifetime
        self.received: set[bytes] = set()
        self.assignments = 0
        self.owned: set[TopicPartition] = set()
        self.final_owned: set[TopicPartition] = set()  # what it owned when told to stop
        self.commits: list[CommitMark] = []
        self.commit_errors = 0
        self.poll_errors = 0  # retriable errors the client raised out of its poll
        self.error: BaseException | None = None
        self.log_dir: str | None = None  # where a client's own group log goes, if it keeps one
        self._pending: dict[TopicPartition, int] = {}  # read, not yet committed: next offset per partition
        self._stop_asked = threading.Event()

    def stop(self) -> None:
        self.final_owned = set(self.owned)  # before leaving the group revokes them
        self._stop_asked.set()

    def running(self) -> bool:
        return not self._stop_asked.is_set() and time.monotonic() < self.deadline

    def run(self) -> None:
        try:
            self.consume()
        except BaseException as exc:  # noqa: BLE001 - reported by the checker
            self.error = exc
            traceback.print_exc()  # where, on stderr; the checker reports what

    @abc.abstractmethod
    def consume(self) -> None:
        """Consume with this client library while running(), through took/to_commit/committed and the
        assigned/revoked callbacks."""

    def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        self.assignments += 1
        self.owned |= set(partitions)

    def revoked(self, partitions: Iterable[TopicPartition]) -> None:
        """Another member reads these from the group's committed offset on: what was read and not committed is
        left to it."""
        for tp in partitions:
            self.owned.discard(tp)
            self._pending.pop(tp, None)

    def took(self, topic: str, partition: int, offset: int, value: bytes) -> None:
        self.received.add(value)
        self._pending[(topic, partition)] = max(self._pending.get((topic, partition), 0), offset + 1)

    def to_commit(self) -> dict[TopicPartition, int]:
        return dict(self._pending)

    def committed(self, offsets: dict[TopicPartition, int], generation: int) -> None:
        self.commits.append(CommitMark(generation, offsets, time.time()))
        for tp, offset in offsets.items():
            if self._pending.get(tp) == offset:
                del self._pending[tp]


def _librdkafka_generation(consumer) -> int:
    """The generation in librdkafka's serialized group metadata ("CGMDv2:", then the native-endian int32), which
    confluent-kafka offers no accessor for; -1 if the layout is not that one."""
    data = bytes(consumer.consumer_group_metadata())
    if not data.startswith(b"CGMDv2:"):
        return -1
    return int.from_bytes(data[7:11], sys.byteorder, signed=True)


class ConfluentMember(GroupMember):
    client = "confluent"

    def consume(self) -> None:
        from confluent_kafka import Consumer, KafkaException
        from confluent_kafka import TopicPartition as TP
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                             "partition.assignment.strategy": "range", **self._group_log()})
        try:
            consumer.subscribe(self.topics,
                               on_assign=lambda _c, ps: self.assigned((p.topic, p.partition) for p in ps),
                               on_revoke=lambda _c, ps: self.revoked((p.topic, p.partition) for p in ps))
            while self.running():
                for m in consumer.consume(num_messages=BATCH, timeout=POLL_S):
                    if m.error() is None:
                        self.took(m.topic(), m.partition(), m.offset(), m.value())
                offsets = self.to_commit()
                if not offsets:
                    continue
                generation = _librdkafka_generation(consumer)
                try:
                    answer = consumer.commit(offsets=[TP(t, p, o) for (t, p), o in offsets.items()],
                                             asynchronous=False)
                except KafkaException:
                    self.commit_errors += 1  # a fault: the next batch's commit covers these records
                    continue
                done = {(tp.topic, tp.partition): tp.offset for tp in answer if tp.error is None}
                self.commit_errors += len(done) < len(offsets)
                if done:
                    self.committed(done, generation)
        finally:
            consumer.close()


    def _group_log(self) -> dict:
        """librdkafka's group protocol log, to a file in log_dir: what the client did when it joined late or never
        (it tells the broker nothing of what it waits for)."""
        if self.log_dir is None:
            return {}
        logger = logging.getLogger(f"soak.{self.member}.librdkafka")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        if not logger.handlers:
            handler = logging.FileHandler(os.path.join(self.log_dir, f"{self.member}-librdkafka.log"))
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))  # beside the brokers' logs
            logger.addHandler(handler)
        return {"debug": "cgrp", "logger": logger}


class KafkaPythonMember(GroupMember):
    client = "kafka-python"

    def consume(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata
        from kafka import TopicPartition as TP
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.errors import KafkaError
        member = self
        unplaced: set = set()  # assigned, and not yet put at the group's committed offset

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                member.revoked((p.topic, p.partition) for p in revoked)

            def on_partitions_assigned(self, assigned):
                member.assigned((p.topic, p.partition) for p in assigned)
                unplaced.update(assigned)

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False,
                                 auto_offset_reset="earliest", session_timeout_ms=SESSION_TIMEOUT_MS,
                                 heartbeat_interval_ms=HEARTBEAT_MS, request_timeout_ms=10000,
                                 partition_assignment_strategy=[RangePartitionAssignor],
                                 reconnect_backoff_max_ms=500, retry_backoff_ms=100)
        try:
            consumer.subscribe(self.topics, listener=Listener())
            while self.running():
                try:
                    batches = consumer.poll(timeout_ms=int(POLL_S * 1000), max_records=BATCH)
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    # kafka-python 3 raises a coordinator lookup's connection error out of poll() after kill -9
                    # rather than retrying it itself; an application polls again
                    self.poll_errors += 1
                    continue
                if unplaced:
                    for tp in list(batches):
                        if tp in unplaced:  # read from where the client left off, not the group's offset
                            del batches[tp]
                    try:
                        place_at_committed(consumer, unplaced)
                    except KafkaError:  # the coordinator is away: those left are placed after the next poll
                        self.poll_errors += 1
                for tp, records in batches.items():
                    for r in records:
                        self.took(tp.topic, tp.partition, r.offset, r.value)
                offsets = self.to_commit()
                if not offsets:
                    continue
                generation = consumer.group_metadata().generation_id
                try:
                    consumer.commit({TP(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})
                except KafkaError:
                    self.commit_errors += 1
                    continue
                self.committed(offsets, generation)
        finally:
            consumer.close()


def place_at_committed(consumer, partitions: set) -> None:
    """Move each partition to the group's committed offset (the start if none), emptying `partitions` as it goes.

    Eager rebalancing hands every partition out afresh in each generation, so a member must read an assigned
    partition from the group's committed offset, as the Java client does. kafka-python 3.0.12 keeps its own position
    instead when the partition was also its own before the rebalance, even when it fell out of the group in between
    (its JoinGroup was refused as an unknown member, or it expired while it believed itself rebalancing) and another
    member read the partition and committed meanwhile: it would read again from behind that commit and commit
    backwards. Kafka brokers answer such a member exactly as kop does, so the member here does what an application
    on kafka-python must do."""
    for tp in sorted(partitions):
        if tp in consumer.assignment():  # else a later rebalance took it away: nothing to place
            offset = consumer.committed(tp, timeout_ms=10000)  # raises: the partition stays to place next poll
            if offset is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
        partitions.discard(tp)


class AiokafkaMember(GroupMember):
    client = "aiokafka"

    def consume(self) -> None:
        asyncio.run(self._consume())

    async def _consume(self) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
        from aiokafka import TopicPartition as TP
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor
        from aiokafka.errors import KafkaError
        member = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                member.revoked((p.topic, p.partition) for p in revoked)

            async def on_partitions_assigned(self, assigned):
                member.assigned((p.topic, p.partition) for p in assigned)

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                    partition_assignment_strategy=(RangePartitionAssignor,), retry_backoff_ms=100)
        await consumer.start()
        try:
            consumer.subscribe(self.topics, listener=Listener())
            while self.running():
                batches = await consumer.getmany(timeout_ms=int(POLL_S * 1000), max_records=BATCH)
                for tp, records in batches.items():
                    for r in records:
                        self.took(tp.topic, tp.partition, r.offset, r.value)
                offsets = self.to_commit()
                if not offsets:
                    continue
                generation = consumer._coordinator.generation  # noqa: SLF001 - aiokafka has no public accessor
                try:
                    await consumer.commit({TP(t, p): o for (t, p), o in offsets.items()})
                except KafkaError:
                    self.commit_errors += 1
                    continue
                self.committed(offsets, generation)
        finally:
            await asyncio.wait_for(consumer.stop(), 30)


class JavaMember(GroupMember):
    """The Java client's KopGroupConsume, one JVM for the member's whole life, told to leave through a stop file;
    its records, assignments and commits are read from the harness's output when it ends."""

    client = "java"

    def __init__(self, bootstrap: str, group: str, topics: Iterable[str], name: str, lifetime: float) -> None:
        super().__init__(bootstrap, group, topics, name, lifetime)
        self.lifetime = lifetime
        self.stop_file = os.path.join(tempfile.gettempdir(), f"kop-soak-stop-{os.getpid()}-{name}")

    def stop(self) -> None:
        super().stop()
        with open(self.stop_file, "w", encoding="utf-8"):
            pass

    def consume(self) -> None:
        try:
            result = java_group_consume(
                self.bootstrap, self.topics, self.group, max_records=1 << 62, commit="sync", assignor="range",
                idle_ms=1 << 40, stop_file=self.stop_file, timeout=self.lifetime,
                extra_props={"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                             "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 100})
        finally:
            if os.path.exists(self.stop_file):
                os.unlink(self.stop_file)
        self.received = {r.value.encode() for r in result.records if r.value is not None}
        self.assignments = sum(1 for c in result.assignment_changes if c.kind == "assigned")
        self.final_owned = set(result.final_topic_assignment)
        self.commits = [CommitMark(c.generation, dict(c.topic_offsets or {}), c.wall_ms / 1000)
                        for c in result.commits if c.error is None]
        self.commit_errors = sum(1 for c in result.commits if c.error is not None)


_ALL = (ConfluentMember, KafkaPythonMember, AiokafkaMember) + ((JavaMember,) if java_available() else ())
MEMBERS: dict[str, type[GroupMember]] = {m.client: m for m in _ALL}


class CommitWatcher(threading.Thread):
    """Reads the group's committed offsets every `interval` seconds: the latest per partition, those that went
    backwards, and each read's offsets with when it was answered (`history`: monotonic seconds, offsets)."""

    def __init__(self, bootstrap: str, group: str, partitions: list[tuple[str, int]], interval: float = 1.0) -> None:
        super().__init__(name="commit-watcher", daemon=True)
        self.bootstrap, self.group, self.partitions, self.interval = bootstrap, group, partitions, interval
        self.latest: dict[tuple[str, int], int] = {}
        self.backwards: list[tuple[str, int, int, int]] = []  # topic, partition, from, to
        self.history: list[tuple[float, dict[tuple[str, int], int]]] = []
        self._stop_asked = threading.Event()

    def stop(self) -> None:
        self._stop_asked.set()

    def read_once(self, consumer) -> None:
        from confluent_kafka import KafkaException, TopicPartition
        try:
            answer = consumer.committed([TopicPartition(t, p) for t, p in self.partitions], timeout=5)
        except KafkaException:
            return  # the broker is down or paused: read again later
        for tp in answer:
            if tp.error is not None or tp.offset < 0:
                continue
            key = (tp.topic, tp.partition)
            before = self.latest.get(key, -1)
            if tp.offset < before:
                self.backwards.append((tp.topic, tp.partition, before, tp.offset))
            self.latest[key] = max(before, tp.offset)
        self.history.append((time.monotonic(), dict(self.latest)))

    def run(self) -> None:
        from confluent_kafka import Consumer
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "enable.auto.commit": False})
        try:
            while not self._stop_asked.wait(self.interval):
                self.read_once(consumer)
            self.read_once(consumer)
        finally:
            consumer.close()
