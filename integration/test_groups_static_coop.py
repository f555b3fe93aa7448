"""Static membership (group.instance.id) and cooperative-sticky incremental rebalancing with the Java client and
confluent-kafka against a real kop process.

Static: a member that restarts with the same instance id within its session takes its old place without a
rebalance; the other member is never revoked and the restarted one resumes in the same generation with the same
partitions. Cooperative: when a second member joins, the first gives up only the partitions that move, keeps
consuming the rest, and never has its whole assignment revoked.
"""
import threading
import time

import pytest

from integration.java_client import java_available, java_unavailable_reason
from integration.test_groups_clients import create_topic, produce
from integration.test_groups_java import Trickle, java_group_consume, run_member
from integration.waiting import wait_for

PARTITIONS = 6
needs_java = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory({"group.min.session.timeout.ms": "1000"})




# ---- Java

@needs_java
@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_java_static_member_restart_keeps_its_partitions_without_a_rebalance(group_broker):
    bootstrap, topic, group = group_broker.bootstrap, "java-static", "java-static-group"
    create_topic(bootstrap, topic)
    trickle = Trickle(bootstrap, topic, per_tick=6, tick=0.2)
    trickle.start()
    static = {"session.timeout.ms": 15000, "heartbeat.interval.ms": 500}
    common = dict(bootstrap=bootstrap, topic=topic, group=group, commit="sync", assignor="range", extra_props=static)
    results: dict = {}
    steady = run_member(results, "b", 0, instance_id="static-b", max_records=100_000, idle_ms=5000, timeout=40,
                        **common)
    time.sleep(4)
    first = java_group_consume(instance_id="static-a", max_records=40, timeout=40, **common)
    second = java_group_consume(instance_id="static-a", max_records=40, timeout=40, **common)
    trickle.stop()
    steady.join(60)
    b = results["b"]
    first_generation = max(c.generation for c in first.assignment_changes if c.kind == "assigned")
    second_assigned = [c for c in second.assignment_changes if c.kind == "assigned"]
    assert [c.generation for c in second_assigned] == [first_generation]
    assert set(second_assigned[0].partitions) == set(first.final_assignment)
    assert second.assignment_changes[0].member_id != first.assignment_changes[0].member_id
    # b saw the generation a joined, then nothing until it closed: the restart caused no rebalance
    last_assigned = max(i for i, c in enumerate(b.assignment_changes) if c.kind == "assigned")
    assert b.assignment_changes[last_assigned].generation == first_generation
    after = b.assignment_changes[last_assigned + 1:]
    assert [c.kind for c in after] in ([], ["revoked"]), after  # at most the revocation of its own close
    # the second a resumed at the first a's commits: nothing twice, nothing skipped on a's partitions
    offsets = [(r.partition, r.offset) for r in first.records + second.records]
    assert len(offsets) == len(set(offsets))


@needs_java
@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_java_cooperative_sticky_moves_only_the_partitions_that_change_owner(group_broker):
    bootstrap, topic, group = group_broker.bootstrap, "java-coop", "java-coop-group"
    create_topic(bootstrap, topic)
    trickle = Trickle(bootstrap, topic)
    trickle.start()
    common = dict(bootstrap=bootstrap, topic=topic, group=group, commit="sync", assignor="cooperative-sticky",
                  extra_props={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    results: dict = {}
    threads = [run_member(results, "a", 0, max_records=100_000, idle_ms=4000, timeout=50, **common),
               run_member(results, "b", 3, max_records=100_000, idle_ms=4000, timeout=50, **common)]
    time.sleep(10)  # b joins after 3 s; both keep reading while records arrive
    trickle.stop()
    for thread in threads:
        thread.join(60)
    a, b = results["a"], results["b"]
    a_changes = [(c.kind, set(c.partitions)) for c in a.assignment_changes]
    assert a_changes[0] == ("assigned", set(range(PARTITIONS)))
    revoked = [parts for kind, parts in a_changes[:-1] if kind == "revoked" and parts]
    assert revoked and all(len(parts) == PARTITIONS // 2 for parts in revoked), a_changes
    # after the incremental rebalance a keeps the rest and b holds what a gave up (not their assignments at close:
    # whichever closes first hands its partitions to the other)
    b_first = next(set(c.partitions) for c in b.assignment_changes if c.kind == "assigned" and c.partitions)
    assert b_first == revoked[0]
    assert len(set(range(PARTITIONS)) - revoked[0]) == len(b_first) == PARTITIONS // 2
    # a kept reading its remaining partitions across the rebalance, and nothing was read twice
    seen = [(r.partition, r.offset) for r in a.records + b.records]
    assert len(seen) == len(set(seen))
    assert set(trickle.values) == {r.value for r in a.records + b.records}


# ---- confluent-kafka

class CkMember:
    """A confluent-kafka consumer in a thread that records its rebalance callbacks. Only that thread touches the
    consumer: calling it from another thread while a rebalance callback waits for the GIL deadlocks."""

    def __init__(self, bootstrap, topic, group, **conf):
        from confluent_kafka import Consumer
        self.events: list[tuple[str, frozenset]] = []
        self.values: list[str] = []
        self.current: frozenset = frozenset()
        self._halt = threading.Event()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest", "heartbeat.interval.ms": 500, **conf})
        self.consumer.subscribe([topic], on_assign=self._on("assign"), on_revoke=self._on("revoke"))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on(self, kind):
        def callback(consumer, partitions):
            self.events.append((kind, frozenset(p.partition for p in partitions)))
            if kind == "revoke":
                self._commit()  # what was read of them since the last commit (refused during the rebalance)
        return callback

    def _commit(self):
        from confluent_kafka import KafkaException
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException:
            pass  # nothing consumed since the last commit, or a commit refused: at least once, as Kafka documents

    def _run(self):
        while not self._halt.is_set():
            msgs = [m for m in self.consumer.consume(50, timeout=0.2) if m.error() is None]
            self.current = frozenset(tp.partition for tp in self.consumer.assignment())
            if msgs:
                self.values.extend(m.value().decode() for m in msgs)
                self._commit()
        self.consumer.close()

    def assignment(self) -> frozenset:
        return self.current

    def close(self):
        self._halt.set()
        self.thread.join(30)


def test_confluent_static_member_restart_keeps_its_partitions_without_a_rebalance(group_broker):
    bootstrap, topic, group = group_broker.bootstrap, "ck-static", "ck-static-group"
    create_topic(bootstrap, topic)
    produce(bootstrap, topic, 0, 60)
    static = {"session.timeout.ms": 10000, "partition.assignment.strategy": "range"}
    b = CkMember(bootstrap, topic, group, **{"group.instance.id": "static-b"}, **static)
    a1 = CkMember(bootstrap, topic, group, **{"group.instance.id": "static-a"}, **static)
    wait_for(lambda: len(a1.assignment()) == 3 and len(b.assignment()) == 3, "two static members sharing", timeout=40)
    kept = a1.assignment()
    b_events = list(b.events)
    a1.close()  # a static member does not leave the group on close
    a2 = CkMember(bootstrap, topic, group, **{"group.instance.id": "static-a"}, **static)
    try:
        wait_for(lambda: a2.assignment(), "the restarted member's assignment", timeout=40)
        assert a2.assignment() == kept
        produce(bootstrap, topic, 60, 60)
        wait_for(lambda: {str(i) for i in range(120)} <= set(a1.values + a2.values + b.values), "every record", timeout=40)
        assert b.events == b_events, "b was rebalanced by a's restart"
    finally:
        a2.close()
        b.close()


def test_confluent_cooperative_sticky_moves_only_the_partitions_that_change_owner(group_broker):
    bootstrap, topic, group = group_broker.bootstrap, "ck-coop", "ck-coop-group"
    create_topic(bootstrap, topic)
    produce(bootstrap, topic, 0, 60)
    coop = {"session.timeout.ms": 6000, "partition.assignment.strategy": "cooperative-sticky"}
    a = CkMember(bootstrap, topic, group, **coop)
    wait_for(lambda: len(a.assignment()) == PARTITIONS, "a alone", timeout=40)
    b = CkMember(bootstrap, topic, group, **coop)
    try:
        wait_for(lambda: len(a.assignment()) == 3 and len(b.assignment()) == 3, "a and b sharing", timeout=40)
        produce(bootstrap, topic, 60, 60)
        wait_for(lambda: {str(i) for i in range(120)} <= set(a.values + b.values), "every record", timeout=40)
        assert a.events[0] == ("assign", frozenset(range(PARTITIONS)))
        revokes = [parts for kind, parts in a.events if kind == "revoke"]
        assert revokes == [frozenset(range(PARTITIONS)) - a.assignment()], a.events
        # b only ever gained partitions (the first incremental generation may give it none yet)
        assert {kind for kind, _ in b.events} == {"assign"}
        assert frozenset().union(*(parts for _, parts in b.events)) == b.assignment()
        assert len(a.values + b.values) == len(set(a.values + b.values)) == 120
    finally:
        a.close()
        b.close()
