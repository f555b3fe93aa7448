"""KIP-848's consumer group protocol with the official Java client (kafka-clients 3.9, `group.protocol=consumer`)
against a real kop process: members join while records arrive, one leaves after its share, one is killed with
SIGKILL (it never leaves: the broker's session timeout removes it), with both server-side assignors
(`group.remote.assignor`); every record is delivered, the partitions added at one member epoch are never added to two
members, and a record is delivered twice only when no commit covered its first delivery
(test_groups_java.check_group_run)."""
import json
import signal
import subprocess
import threading
import time

import pytest

from integration import java_harness
from integration.java_client import JVM_OPTIONS, GroupConsumeResult, java_available, java_unavailable_reason
from integration.test_groups_clients import create_topic
from integration.test_groups_java import Trickle, check_group_run, group_consume_args, group_result, run_member

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())

BROKER = {"group.consumer.session.timeout.ms": "3000", "group.consumer.heartbeat.interval.ms": "500"}


@pytest.fixture
def kip848_broker(broker_factory):
    return broker_factory(BROKER)


class KillableMember:
    """A Java member in a JVM of its own whose lines are read as they come, so the test can kill it mid-run."""

    def __init__(self, args: list[str]) -> None:
        command = ["java", *JVM_OPTIONS, "-cp", java_harness.classpath(), "KopGroupConsume", *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip():
                self.lines.append(json.loads(line))

    def records(self) -> int:
        return sum(1 for line in list(self.lines) if line["type"] == "record")

    def kill(self) -> GroupConsumeResult:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        return group_result(self.lines)


def committed_before(result: GroupConsumeResult, partition: int, epoch: int) -> int:
    """What a member had committed of a partition before it took part in `epoch` (its own clock orders both)."""
    cutoff = min((c.at_ms for c in result.assignment_changes if c.generation >= epoch), default=float("inf"))
    return max((c.offsets.get(partition, -1) for c in result.commits if c.error is None and c.at_ms < cutoff),
               default=-1)


def rereads_after_reset(results: dict[str, GroupConsumeResult]) -> frozenset[tuple[int, int]]:
    """The records the Java client 3.9 reads again when it resets a partition to auto.offset.reset instead of its
    committed offset: a partition added to a member while that member's OffsetFetch for its other new partitions is
    in flight gets no committed-offset lookup (KAFKA-17674, fixed in the 4.0 client; the broker sees no OffsetFetch
    for it). Its signature: a member's first record of a partition is offset 0 although a member that held the
    partition at an earlier epoch had committed past 0. Every record of that partition below what the earlier
    owners committed may then be delivered and committed twice, directly or through the offset the reset member
    commits (the ownership and no-skip checks still hold for them)."""
    excused = set()
    for name, result in results.items():
        first_read = {}
        for record in result.records:
            first_read.setdefault(record.partition, record.offset)
        for partition, offset in first_read.items():
            got_at = min(c.generation for c in result.assignment_changes
                         if c.kind == "assigned" and partition in c.partitions)
            earlier = [other for other_name, other in results.items() if other_name != name and any(
                c.kind == "assigned" and partition in c.partitions and c.generation < got_at
                for c in other.assignment_changes)]
            behind = max((committed_before(other, partition, got_at) for other in earlier), default=-1)
            if offset == 0 and behind > 0:
                excused.update((partition, o) for o in range(behind))
    return frozenset(excused)


@pytest.mark.slow  # three JVMs and a session timeout: about 30 s each
@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_java_consumer_protocol_members_join_leave_and_die_while_records_arrive(kip848_broker, assignor):
    bootstrap, topic, group = kip848_broker.bootstrap, f"java-kip848-{assignor}", f"java-kip848-{assignor}"
    create_topic(bootstrap, topic)
    props = {"group.protocol": "consumer", "group.remote.assignor": assignor}
    trickle = Trickle(bootstrap, topic)
    trickle.start()
    common = dict(bootstrap=bootstrap, topic=topic, group=group, commit="sync", extra_props=props)
    results: dict = {}
    threads = [run_member(results, name, 0, max_records=100_000, idle_ms=4000, timeout=80, **common)
               for name in ("a", "b")]
    threads.append(run_member(results, "c", 6, max_records=60, timeout=60, **common))  # leaves after 60 records
    time.sleep(10)
    killed = KillableMember(group_consume_args(max_records=100_000, idle_ms=60_000, timeout=60, **common))
    deadline = time.monotonic() + 40
    while killed.records() < 30 and time.monotonic() < deadline:
        time.sleep(0.2)
    results["k"] = killed.kill()
    time.sleep(6)  # past its session timeout: a and b take its partitions while records still arrive
    trickle.stop()
    for thread in threads:
        thread.join(90)
    for name, result in results.items():
        assert isinstance(result, GroupConsumeResult), f"{name}: {result}"
    assert results["k"].records, "the killed member never got records"
    assert results["c"].stop_reason == "max_records"
    check_group_run(results, trickle.values, rereads_after_reset(results))
    # the killed member's partitions went to a or b at a later epoch
    k_last = max(c.generation for c in results["k"].assignment_changes if c.kind == "assigned")
    k_parts = {p for c in results["k"].assignment_changes if c.kind == "assigned" for p in c.partitions}
    later = {p for name in ("a", "b") for c in results[name].assignment_changes
             if c.kind == "assigned" and c.generation > k_last for p in c.partitions}
    assert k_parts <= later, f"{sorted(k_parts - later)} never moved on after the kill"
    # control: the Java client really spoke KIP-848's protocol (a classic group would describe as "classic")
    from confluent_kafka import ConsumerGroupType
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client drops its futures
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert described.type == ConsumerGroupType.CONSUMER
