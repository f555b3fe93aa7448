"""Group consumers (librdkafka) that commit after every batch, and a watcher of the group's committed offsets.

A member records every value it receives and how often its partitions were assigned (a rebalance after a fault is
the control that the group noticed it). The watcher reads the committed offsets once a second and counts every one
that moved backwards: a member that lost its partitions must not commit behind the member that took them over.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable

SESSION_TIMEOUT_MS = 6000  # the broker's default minimum: a pause longer than this expires every member
HEARTBEAT_MS = 1000


class GroupMember(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topics: Iterable[str], name: str) -> None:
        super().__init__(name=f"member-{name}", daemon=True)
        self.bootstrap, self.group, self.topics = bootstrap, group, list(topics)
        self.received: set[bytes] = set()
        self.assignments = 0
        self.commit_errors = 0
        self.error: BaseException | None = None
        self._stop_asked = threading.Event()

    def stop(self) -> None:
        self._stop_asked.set()

    def run(self) -> None:
        from confluent_kafka import Consumer, KafkaException
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                             "partition.assignment.strategy": "range"})

        def on_assign(_consumer, _partitions) -> None:
            self.assignments += 1
        try:
            consumer.subscribe(self.topics, on_assign=on_assign)
            while not self._stop_asked.is_set():
                messages = consumer.consume(num_messages=500, timeout=0.5)
                got = [m for m in messages if m.error() is None]
                self.received.update(m.value() for m in got)
                if got:
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException:
                        self.commit_errors += 1  # a fault: the next batch's commit covers these records
        except BaseException as exc:  # noqa: BLE001 - reported by the checker
            self.error = exc
        finally:
            consumer.close()


class CommitWatcher(threading.Thread):
    """Reads the group's committed offsets every `interval` seconds and keeps each partition's history."""

    def __init__(self, bootstrap: str, group: str, partitions: list[tuple[str, int]], interval: float = 1.0) -> None:
        super().__init__(name="commit-watcher", daemon=True)
        self.bootstrap, self.group, self.partitions, self.interval = bootstrap, group, partitions, interval
        self.latest: dict[tuple[str, int], int] = {}
        self.backwards: list[tuple[str, int, int, int]] = []  # topic, partition, from, to
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
