"""A rolling upgrade and downgrade with the official Java client (kafka-clients 3.9): classic members
(`group.protocol=classic`, the range assignor) are joined and then replaced by members with `group.protocol=consumer`
while records keep coming, then classic members replace those: the group becomes a consumer group with both kinds of
member, then one of consumer-protocol members only, then a mixed group again, and a classic group at the end.
Every record is delivered, a record is delivered twice only when no commit covered its first delivery, and the
partitions given at one member epoch are never given to two members (test_groups_java.check_group_run)."""
import os
import threading
import time

import pytest

from integration.idem_raw import RawKafka
from integration.java_client import GroupConsumeResult, java_available, java_unavailable_reason
from integration.test_groups_clients import create_topic
from integration.test_groups_consumer_java import rereads_after_reset
from integration.test_groups_java import Trickle, check_group_run, group_result, java_group_consume_lines
from integration.test_groups_migration_protocol import describe
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())

BROKER = {"group.consumer.session.timeout.ms": "6000", "group.consumer.heartbeat.interval.ms": "500",
          "group.min.session.timeout.ms": "1000"}
CLASSIC = {"group.protocol": "classic", "session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}
CONSUMER = {"group.protocol": "consumer"}


def wait_members(port: int, group: str, classic: int, consumer: int, timeout: float = 60) -> None:
    """Until the group is a consumer group with this many members of each protocol (ConsumerGroupDescribe's member
    types: 0 classic, 1 consumer), or a classic group with `classic` members and `consumer` 0."""
    deadline = time.monotonic() + timeout
    seen = None
    with RawKafka(port) as raw:
        while time.monotonic() < deadline:
            described = describe(raw, group)
            if described.error_code == 0:
                kinds = [m.member_type for m in described.members]
                seen = (kinds.count(0), kinds.count(1))
            else:
                classic_view = raw.call(REQ[15][5](groups=[group], include_authorized_operations=False),
                                        RESP[15], 5).groups[0]
                seen = (len(classic_view.members), 0) if classic_view.group_state == "Stable" else None
            if seen == (classic, consumer):
                return
            time.sleep(0.2)
    raise AssertionError(f"group {group}: (classic, consumer) members {seen}, not {(classic, consumer)}")


class JavaMember(threading.Thread):
    """A KopGroupConsume JVM that runs until it is told to leave (its stop file) or goes idle."""

    def __init__(self, name: str, stop_dir: str, props: dict, idle_ms: int, **common) -> None:
        super().__init__(daemon=True, name=name)
        self.stop_file = os.path.join(stop_dir, name)
        self.kwargs = dict(max_records=1_000_000, idle_ms=idle_ms, timeout=120, extra_props=props,
                           harness_args={"stop-file": self.stop_file}, **common)
        self.result: GroupConsumeResult | Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = group_result(java_group_consume_lines(**self.kwargs))
        except Exception as exc:  # reported by the test
            self.result = exc

    def leave(self) -> None:
        open(self.stop_file, "w").close()


@pytest.mark.slow  # six JVMs over about a minute
def test_java_members_move_to_the_consumer_protocol_and_back_while_records_arrive(broker_factory, tmp_path):
    broker = broker_factory(BROKER)
    bootstrap, topic = broker.bootstrap, "java-rolling"
    group = topic
    create_topic(bootstrap, topic)
    trickle = Trickle(bootstrap, topic)
    trickle.start()
    common = dict(bootstrap=bootstrap, topic=topic, group=group, commit="sync", assignor="range")
    members: dict[str, JavaMember] = {}

    def start(name: str, props: dict, idle_ms: int = 60_000) -> None:
        members[name] = JavaMember(name, str(tmp_path), props, idle_ms, **common)

    try:
        start("classic-a", CLASSIC)
        start("classic-b", CLASSIC)
        wait_members(broker.port, group, 2, 0)
        start("consumer-1", CONSUMER)
        wait_members(broker.port, group, 2, 1)  # the upgrade: one group, both protocols
        time.sleep(3)
        members["classic-a"].leave()
        start("consumer-2", CONSUMER)
        wait_members(broker.port, group, 1, 2)
        time.sleep(3)
        members["classic-b"].leave()
        wait_members(broker.port, group, 0, 2)
        time.sleep(3)  # the consumer-protocol members alone for a while
        # and back: classic members join the consumer group, which turns classic when the last consumer leaves
        start("classic-c", CLASSIC, idle_ms=4000)
        wait_members(broker.port, group, 1, 2)
        members["consumer-1"].leave()
        start("classic-d", CLASSIC, idle_ms=4000)
        wait_members(broker.port, group, 2, 1)
        time.sleep(3)
        members["consumer-2"].leave()
        wait_members(broker.port, group, 2, 0)  # a classic group again (the downgrade)
        time.sleep(3)
        trickle.stop()
        for name in ("classic-c", "classic-d"):
            members[name].join(60)  # they stop once idle, having read the last records
    finally:
        trickle.stop()
        for member in members.values():
            member.leave()
        for member in members.values():
            member.join(90)
    results = {name: member.result for name, member in members.items()}
    for name, result in results.items():
        assert isinstance(result, GroupConsumeResult), f"{name}: {result}"
        assert result.records, f"{name} never got records"
    assert [results[name].stop_reason for name in ("classic-a", "classic-b", "consumer-1", "consumer-2")] == \
        ["stopped"] * 4
    assert results["classic-c"].stop_reason == results["classic-d"].stop_reason == "idle"
    check_group_run(results, trickle.values, rereads_after_reset(results))
    # the consumer-protocol members took over the classic members' partitions at later epochs
    last_classic = max(c.generation for name in ("classic-a", "classic-b")
                       for c in results[name].assignment_changes if c.kind == "assigned")
    taken = {p for name in ("consumer-1", "consumer-2") for c in results[name].assignment_changes
             if c.kind == "assigned" and c.generation >= last_classic for p in c.partitions}
    assert taken, "no partition moved to a consumer-protocol member after the classic members' last generation"
