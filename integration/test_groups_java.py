"""Consumer groups with the official Java client (kafka-clients 3.9) against a real kop process: members joining,
leaving, and closing without LeaveGroup (as a crashed process would) while records keep arriving; every record is
delivered, each generation's assignments are disjoint, and a record is delivered twice only when no commit covered
its first delivery. Also the cooperative-sticky assignor's incremental rebalances and static membership."""
import json
import threading
import time
from collections import defaultdict

import pytest

from integration.java_client import (ASSIGNORS, AssignmentChange, Commit, Consumed, GroupConsumeResult,
                                     JavaClientError, java_available, java_unavailable_reason, run_java)
from integration.test_groups_clients import create_topic

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())

PARTITIONS = 6
FAST = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory({"group.min.session.timeout.ms": "1000"})


def java_group_consume(bootstrap: str, topic: str, group: str, *, max_records: int, commit: str = "sync",
                       assignor: str | None = None, instance_id: str | None = None, idle_ms: int = 5000,
                       extra_props: dict | None = None, timeout: float = 60) -> GroupConsumeResult:
    """As integration.java_client.java_group_consume, but tolerant of the "revoked" line that KopGroupConsume
    prints after its summary when close() leaves the group (that helper rejects such output)."""
    lines = java_group_consume_lines(bootstrap, topic, group, max_records=max_records, commit=commit,
                                     assignor=assignor, instance_id=instance_id, idle_ms=idle_ms,
                                     extra_props=extra_props, timeout=timeout)
    return group_result(lines)


def group_result(lines: list[dict]) -> GroupConsumeResult:
    """KopGroupConsume's lines as a result; a member killed before its summary stopped for reason "killed"."""
    summary = next((line for line in lines if line["type"] == "summary"), {"assignment": [], "reason": "killed"})
    return GroupConsumeResult(
        records=tuple(Consumed(l["topic"], l["partition"], l["offset"], l["key"], l["value"],
                               tuple(map(tuple, l["headers"])), l["timestamp"], l["timestamp_type"])
                      for l in lines if l["type"] == "record"),
        assignment_changes=tuple(AssignmentChange(l["type"], tuple(l["partitions"]), l["generation"],
                                                  l["member_id"], l["at_ms"])
                                 for l in lines if l["type"] in ("assigned", "revoked", "lost")),
        commits=tuple(Commit({int(p): o for p, o in l["offsets"].items()}, l["error"], l["error_message"],
                             l["at_ms"]) for l in lines if l["type"] in ("committed", "commit_failed")),
        final_assignment=tuple(summary["assignment"]), stop_reason=summary["reason"])


def java_group_consume_lines(bootstrap: str, topic: str, group: str, *, max_records: int, commit: str = "sync",
                             assignor: str | None = None, instance_id: str | None = None, idle_ms: int = 5000,
                             extra_props: dict | None = None, harness_args: dict | None = None,
                             timeout: float = 60) -> list[dict]:
    """Run KopGroupConsume; its JSON lines (harness_args: more of its --options, e.g. commit-metadata)."""
    args = group_consume_args(bootstrap, topic, group, max_records=max_records, commit=commit, assignor=assignor,
                              instance_id=instance_id, idle_ms=idle_ms, extra_props=extra_props,
                              harness_args=harness_args, timeout=timeout)
    done = run_java("KopGroupConsume", args, timeout)
    if done.returncode != 0:
        raise JavaClientError(f"KopGroupConsume exited with {done.returncode}", stdout=done.stdout,
                              stderr=done.stderr)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if not any(line["type"] == "summary" for line in lines):
        raise JavaClientError("no summary line", stdout=done.stdout, stderr=done.stderr)
    return lines


def group_consume_args(bootstrap: str, topic: str, group: str, *, max_records: int, commit: str = "sync",
                       assignor: str | None = None, instance_id: str | None = None, idle_ms: int = 5000,
                       extra_props: dict | None = None, harness_args: dict | None = None,
                       timeout: float = 60) -> list[str]:
    """KopGroupConsume's command line."""
    props = {"auto.offset.reset": "earliest", "enable.auto.commit": "false", **(extra_props or {})}
    if assignor is not None:
        props["partition.assignment.strategy"] = ASSIGNORS.get(assignor, assignor)
    if instance_id is not None:
        props["group.instance.id"] = instance_id
    args = ["--bootstrap", bootstrap]
    for key, value in props.items():
        args += ["--prop", f"{key}={value}"]
    args += ["--topic", topic, "--group", group, "--max-records", str(max_records), "--idle-ms", str(idle_ms),
             "--commit", commit, "--deadline-ms", str(int(timeout * 750))]
    for key, value in (harness_args or {}).items():
        args += [f"--{key}", value]
    return args


class Trickle(threading.Thread):
    """Produces `per_tick` records every `tick` seconds, round-robin over the partitions, until stopped."""

    def __init__(self, bootstrap, topic, per_tick=12, tick=0.2):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.per_tick, self.tick = bootstrap, topic, per_tick, tick
        self.values: list[str] = []
        self._halt = threading.Event()

    def run(self):
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        i = 0
        while not self._halt.is_set():
            for _ in range(self.per_tick):
                producer.produce(self.topic, value=str(i).encode(), partition=i % PARTITIONS)
                self.values.append(str(i))
                i += 1
            producer.poll(0)
            time.sleep(self.tick)
        assert producer.flush(30) == 0

    def stop(self):
        self._halt.set()
        self.join(40)


def run_member(results: dict, name: str, delay: float, **kwargs) -> threading.Thread:
    def go():
        time.sleep(delay)
        try:
            results[name] = java_group_consume(**kwargs)
        except Exception as exc:  # reported by the test
            results[name] = exc
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def committed_position(result: GroupConsumeResult, partition: int) -> int:
    return max((c.offsets.get(partition, -1) for c in result.commits if c.error is None), default=-1)


def last_shared_generation(a: GroupConsumeResult, b: GroupConsumeResult) -> dict[str, set[int]]:
    """The eager shares of a and b in the newest generation that assigned partitions to both."""
    shares = defaultdict(dict)
    for name, result in (("a", a), ("b", b)):
        for change in result.assignment_changes:
            if change.kind == "assigned":
                shares[change.generation][name] = set(change.partitions)
    both = [generation for generation, by_member in shares.items() if len(by_member) == 2]
    assert both, f"a and b never shared a generation: {dict(shares)}"
    return shares[max(both)]


def check_group_run(results: dict[str, GroupConsumeResult], produced: list[str],
                    excused: frozenset[tuple[int, int]] = frozenset()) -> None:
    """excused: (partition, offset) of records a client bug re-delivers (see test_groups_consumer_java)."""
    deliveries = defaultdict(list)  # value -> [(member, partition, offset)]
    for name, result in results.items():
        for record in result.records:
            deliveries[record.value].append((name, record.partition, record.offset))
    assert set(deliveries) == set(produced), f"{len(set(produced) - set(deliveries))} records skipped"
    for value, ds in deliveries.items():
        if len(ds) > 1 and (ds[0][1], ds[0][2]) not in excused:
            covered = [committed_position(results[m], p) > o for m, p, o in ds]
            assert not all(covered), f"record {value} delivered and committed twice: {ds}"
    # each generation's assignments are disjoint (eager protocol: "assigned" carries the whole share)
    shares = defaultdict(dict)
    for name, result in results.items():
        for change in result.assignment_changes:
            if change.kind == "assigned":
                shares[change.generation][name] = set(change.partitions)
    for generation, by_member in shares.items():
        taken = [p for parts in by_member.values() for p in parts]
        assert len(taken) == len(set(taken)), f"generation {generation} gave a partition twice: {by_member}"


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_java_members_join_leave_and_vanish_while_records_arrive(group_broker):
    bootstrap, topic, group = group_broker.bootstrap, "java-shared", "java-group"
    create_topic(bootstrap, topic)
    trickle = Trickle(bootstrap, topic)
    trickle.start()
    common = dict(bootstrap=bootstrap, topic=topic, group=group, commit="sync", assignor="range")
    results: dict = {}
    threads = [
        run_member(results, "a", 0, max_records=100_000, idle_ms=4000, extra_props=FAST, timeout=80, **common),
        run_member(results, "b", 0, max_records=100_000, idle_ms=4000, extra_props=FAST, timeout=80, **common),
        # joins later and leaves cleanly after 60 records
        run_member(results, "c", 6, max_records=60, extra_props=FAST, timeout=60, **common),
        # joins later and closes without LeaveGroup: its session must run out
        run_member(results, "d", 12, max_records=60, timeout=60, **common,
                   extra_props={**FAST, "internal.leave.group.on.close": "false"}),
    ]
    threads[3].join(70)
    time.sleep(5)  # past d's session timeout, so a and b take its partitions while records still arrive
    trickle.stop()
    for thread in threads:
        thread.join(90)
    for name, result in results.items():
        assert isinstance(result, GroupConsumeResult), f"{name}: {result}"
    assert results["c"].stop_reason == results["d"].stop_reason == "max_records"
    check_group_run(results, trickle.values)
    # the last generation a and b shared gave them three partitions each (their assignments at close are not
    # compared: whichever closes first hands its partitions to the other, which may still be polling)
    shared = last_shared_generation(results["a"], results["b"])
    assert len(shared["a"]) == len(shared["b"]) == 3
    assert sorted(shared["a"] | shared["b"]) == list(range(PARTITIONS))
    # generations of three members gave two partitions each
    by_generation = defaultdict(list)
    for result in results.values():
        for change in result.assignment_changes:
            if change.kind == "assigned":
                by_generation[change.generation].append(len(change.partitions))
    threesomes = [sizes for sizes in by_generation.values() if len(sizes) == 3]
    assert threesomes and all(sorted(sizes) == [2, 2, 2] for sizes in threesomes), dict(by_generation)
    # d vanished without leaving: a and b were reassigned its partitions in a later generation
    d_last = max(c.generation for c in results["d"].assignment_changes if c.kind == "assigned")
    assert any(c.generation > d_last for c in results["a"].assignment_changes if c.kind == "assigned")


def test_java_commits_carry_metadata_and_a_leader_epoch_that_read_back_exactly(group_broker):
    """OffsetAndMetadata(offset, leaderEpoch, metadata) from the Java client comes back the same through another
    client's OffsetFetch and through the Java client's own committed(), and the group resumes there."""
    from integration.test_groups_clients import produce
    from kafka.admin import KafkaAdminClient
    bootstrap, topic, group = group_broker.bootstrap, "java-meta", "java-meta-group"
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, 0, 40, partitions=2)
    first = java_group_consume_lines(bootstrap, topic, group, max_records=20, timeout=60,
                                     harness_args={"commit-metadata": "java meta/1", "commit-leader-epoch": "0"})
    read_first = [(l["partition"], l["offset"]) for l in first if l["type"] == "record"]
    expected = {p: max(o for q, o in read_first if q == p) + 1 for p in {p for p, _ in read_first}}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    assert {tp.partition: (om.offset, om.metadata, om.leader_epoch) for tp, om in offsets.items()} == \
        {p: (o, "java meta/1", 0) for p, o in expected.items()}
    second = java_group_consume_lines(bootstrap, topic, group, max_records=20, timeout=60,
                                      harness_args={"print-committed": "1"})
    (read_back,) = [l["offsets"] for l in second if l["type"] == "committed_read"]
    assert read_back == {str(p): {"offset": expected[p], "leader_epoch": 0, "metadata": "java meta/1"}
                         if p in expected else None for p in (0, 1)}  # null: nothing committed there
    read_second = [(l["partition"], l["offset"]) for l in second if l["type"] == "record"]
    assert sorted(read_first + read_second) == sorted((i % 2, i // 2) for i in range(40))
