"""Consumer groups with the Python client libraries (kafka-python, aiokafka, confluent-kafka) against a real kop
process: two and then three members share the partitions evenly, a member that leaves and a member that is killed
(its process gets SIGKILL, so it never sends LeaveGroup and its session runs out) hand their partitions over, every
record is delivered, and a record is delivered twice only when the first delivery was never committed.

Each member commits synchronously after every batch it processed, so a clean rebalance delivers nothing twice;
and no two members of one generation receive the same record (each client's generation is read before and after
each poll; a batch polled across a generation change is not attributed to either).
"""
import asyncio
import json
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from integration.broker_process import REPO

PARTITIONS = 6
SESSION_MS = 3000  # the test broker allows sessions down to 1 s, so a killed member is noticed quickly
HEARTBEAT_MS = 500
WAIT_S = 40


@pytest.fixture
def group_broker(broker_factory):
    return broker_factory({"group.min.session.timeout.ms": "1000"})


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce(bootstrap: str, topic: str, start: int, count: int, partitions: int = PARTITIONS) -> list[str]:
    """Values str(i) for i in [start, start + count), round-robin over the partitions."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = [str(i) for i in range(start, start + count)]
    for i, value in zip(range(start, start + count), values):
        producer.produce(topic, value=value.encode(), partition=i % partitions)
    assert producer.flush(30) == 0
    return values


def kp_subscribe(consumer, topic: str, timeout_ms: int = 60_000) -> None:
    """Subscribe a kafka-python 3.0.12 consumer and join its group in one call that waits for the whole JoinGroup
    and SyncGroup round trip, so that its first rebalance is its only one.

    poll() joins with its own timeout and leaves a join it did not see finish in flight; the next poll() that finds
    it finished throws its result away and joins again (a second rebalance; each one that outlasts a poll() starts
    another). And the leader notes the metadata it assigned with (the subscribed topics as its metadata listener
    last saw them) and rejoins when that changes: subscribed, with no metadata response seen since, that is empty.
    If that rejoin is still in flight when poll() returns, the assignment inside it records the new metadata,
    need_rejoin() turns False, and no later poll() completes the join: the client stays REBALANCING against a
    Stable group, sends no heartbeats (the broker expires it after its session) and fails every commit itself
    ("not part of an active group"). So: a metadata response after subscribe() (topics() waits for one), then the
    join, waited for (kafka-python has no public call for it)."""
    consumer.subscribe([topic])
    consumer.topics()
    assert consumer._coordinator.ensure_active_group(timeout_ms=timeout_ms), "kafka-python did not join its group"


# ---- one client library behind one small interface

class KafkaPythonClient:
    def __init__(self, bootstrap, topic, group, **extra):
        from kafka import KafkaConsumer
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                      auto_offset_reset="earliest", enable_auto_commit=False,
                                      session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                      max_poll_records=50, **extra)
        kp_subscribe(self.consumer, topic)

    def poll(self):
        return [(m.partition, m.offset, m.value.decode())
                for batch in self.consumer.poll(timeout_ms=200).values() for m in batch]

    def generation(self):
        return self.consumer._coordinator._generation.generation_id  # no public accessor

    def assignment(self):
        return frozenset(tp.partition for tp in self.consumer.assignment())

    def commit(self) -> str | None:
        from kafka.errors import KafkaError
        try:
            self.consumer.commit()
            return None
        except KafkaError as exc:
            return repr(exc)

    def close(self):
        self.consumer.close(autocommit=False)


class ConfluentClient:
    def __init__(self, bootstrap, topic, group, **extra):
        from confluent_kafka import Consumer
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS, **extra})
        self.consumer.subscribe([topic])

    def poll(self):
        out = []
        for msg in self.consumer.consume(num_messages=50, timeout=0.2):
            if msg.error() is None:
                out.append((msg.partition(), msg.offset(), msg.value().decode()))
        return out

    def generation(self):
        # librdkafka shows its generation only in the serialized group metadata meant for transactions
        # (rd_kafka_consumer_group_metadata_write): 7 magic bytes "CGMDv2:", then the int32 in native byte order.
        raw = self.consumer.consumer_group_metadata()
        assert raw[:7] == b"CGMDv2:", f"unknown consumer group metadata format {raw[:7]!r}"
        return struct.unpack_from("=i", raw, 7)[0]

    def assignment(self):
        return frozenset(tp.partition for tp in self.consumer.assignment())

    def commit(self) -> str | None:
        from confluent_kafka import KafkaError, KafkaException
        try:
            self.consumer.commit(asynchronous=False)
            return None
        except KafkaException as exc:
            error = exc.args[0]
            return None if error.code() == KafkaError._NO_OFFSET else str(error)  # nothing left to commit

    def close(self):
        self.consumer.close()


class AiokafkaClient:
    """aiokafka is asyncio-only: it runs on a loop owned by the member's thread (heartbeats run while it polls)."""

    def __init__(self, bootstrap, topic, group, **extra):
        from aiokafka import AIOKafkaConsumer
        self.loop = asyncio.new_event_loop()

        async def make():
            consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                        auto_offset_reset="earliest", enable_auto_commit=False,
                                        session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                        max_poll_records=50, **extra)
            await consumer.start()
            return consumer
        self.consumer = self.loop.run_until_complete(make())

    def poll(self):
        batches = self.loop.run_until_complete(self.consumer.getmany(timeout_ms=200))
        return [(m.partition, m.offset, m.value.decode()) for batch in batches.values() for m in batch]

    def generation(self):
        return self.consumer._coordinator.generation  # no public accessor

    def assignment(self):
        return frozenset(tp.partition for tp in self.consumer.assignment())

    def commit(self) -> str | None:
        from aiokafka.errors import KafkaError
        try:
            self.loop.run_until_complete(self.consumer.commit())
            return None
        except KafkaError as exc:
            return repr(exc)

    def close(self):
        try:
            self.loop.run_until_complete(self.consumer.stop())
        finally:
            self.loop.close()


class ConfluentConsumerProtocolClient(ConfluentClient):
    """librdkafka with KIP-848's consumer group protocol: the broker assigns and sets the session and heartbeat
    times (librdkafka refuses session.timeout.ms and heartbeat.interval.ms with it)."""

    def __init__(self, bootstrap, topic, group, **extra):
        from confluent_kafka import Consumer
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra})
        self.consumer.subscribe([topic])


CLIENTS = {"kafka-python": KafkaPythonClient, "confluent-kafka": ConfluentClient, "aiokafka": AiokafkaClient}
# Members of KIP-848's protocol, driven the same way (integration/test_groups_consumer_clients.py)
CONSUMER_PROTOCOL_CLIENTS = {"confluent-kafka-consumer-protocol": ConfluentConsumerProtocolClient}


@dataclass(frozen=True)
class Delivery:
    member: str
    generation: int | None
    partition: int
    offset: int
    value: str
    committed: bool


@dataclass
class MemberLog:
    """What one member saw: deliveries (committed or not) and its latest assignment."""
    name: str
    deliveries: list[Delivery] = field(default_factory=list)
    assignment: frozenset = frozenset()
    error: BaseException | None = None
    commit_errors: list[str] = field(default_factory=list)  # why commits failed, in order


def consume_loop(client, log: MemberLog, stop: threading.Event, emit=None) -> None:
    """Poll, record, commit synchronously after each batch, until stopped."""
    while not stop.is_set():
        before = client.generation()
        records = client.poll()
        generation = client.generation()
        if generation != before:
            generation = None  # polled across a rebalance: which generation delivered it is unknown
        assignment = client.assignment()
        if assignment != log.assignment:
            log.assignment = assignment
            if emit:
                emit({"t": "assign", "parts": sorted(assignment)})
        if not records:
            continue
        if emit:
            for partition, offset, value in records:
                emit({"t": "rec", "p": partition, "o": offset, "v": value, "g": generation})
        error = client.commit()
        ok = error is None
        if error is not None:
            log.commit_errors.append(error)
        if emit:
            emit({"t": "commit", "ok": ok})
        log.deliveries.extend(Delivery(log.name, generation, p, o, v, ok) for p, o, v in records)


class ThreadMember:
    def __init__(self, lib, bootstrap, topic, group, name, **extra):
        self.log = MemberLog(name)
        self._stop = threading.Event()
        self._args = (lib, bootstrap, topic, group, extra)
        self._thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self._thread.start()

    def _run(self):
        lib, bootstrap, topic, group, extra = self._args
        client = None
        try:
            client = (CLIENTS | CONSUMER_PROTOCOL_CLIENTS)[lib](bootstrap, topic, group, **extra)
            consume_loop(client, self.log, self._stop)
        except BaseException as exc:  # reported by the test
            self.log.error = exc
        finally:
            if client is not None:
                client.close()  # a clean close: LeaveGroup

    def leave(self, timeout: float = 30) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.log.name} did not close"


def subprocess_member_main() -> None:
    """Entry point of a member in its own process: prints one JSON line per assignment, record and commit."""
    lib, bootstrap, topic, group, name = sys.argv[1:6]
    lock = threading.Lock()

    def emit(obj):
        with lock:
            print(json.dumps(obj), flush=True)
    client = (CLIENTS | CONSUMER_PROTOCOL_CLIENTS)[lib](bootstrap, topic, group)
    consume_loop(client, MemberLog(name), threading.Event(), emit)


class ProcessMember:
    """A member in a child process, so it can be killed without a chance to leave the group."""

    def __init__(self, lib, bootstrap, topic, group, name):
        self.log = MemberLog(name)
        code = "from integration.test_groups_clients import subprocess_member_main as m; m()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, lib, bootstrap, topic, group, name], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._pending: list[tuple[int, int, str, int | None]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            event = json.loads(line)
            if event["t"] == "assign":
                self.log.assignment = frozenset(event["parts"])
            elif event["t"] == "rec":
                self._pending.append((event["p"], event["o"], event["v"], event["g"]))
            elif event["t"] == "commit":
                self.log.deliveries.extend(Delivery(self.log.name, g, p, o, v, event["ok"])
                                           for p, o, v, g in self._pending)
                self._pending = []

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        # records it printed but never reported committing count as uncommitted deliveries
        self.log.deliveries.extend(Delivery(self.log.name, g, p, o, v, False) for p, o, v, g in self._pending)
        self.log.assignment = frozenset()


# ---- waiting and checking

def wait_balanced(members, what: str, timeout: float = WAIT_S) -> None:
    """Until every member holds an equal share of the partitions and the shares are disjoint and complete."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in members:
            assert m.log.error is None, f"{m.log.name} failed: {m.log.error!r}"
        shares = [m.log.assignment for m in members]
        if all(len(s) == PARTITIONS // len(members) for s in shares) and \
                frozenset().union(*shares) == frozenset(range(PARTITIONS)):
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not balanced in {timeout}s: "
                         f"{ {m.log.name: sorted(m.log.assignment) for m in members} }")


def wait_delivered(members, values: list[str], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    wanted = set(values)
    while time.monotonic() < deadline:
        seen = {d.value for m in members for d in list(m.log.deliveries)}
        if wanted <= seen:
            return
        time.sleep(0.1)
    seen = {d.value for m in members for d in list(m.log.deliveries)}
    raise AssertionError(f"{len(wanted - seen)} records never delivered, e.g. {sorted(wanted - seen)[:5]}")


def check_deliveries(members, produced: list[str]) -> None:
    deliveries = [d for m in members for d in m.log.deliveries]
    by_value = defaultdict(list)
    for d in deliveries:
        by_value[d.value].append(d)
    assert set(by_value) == set(produced), "a record was skipped or invented"
    for value, ds in by_value.items():
        if len(ds) > 1:
            # delivered again only because an earlier delivery's commit never happened
            assert sum(d.committed for d in ds) <= 1, f"record {value} committed by several members: {ds}"
            assert not all(d.committed for d in ds), f"record {value} delivered twice: {ds}"
    owners = defaultdict(set)
    for d in deliveries:
        if d.generation is not None:
            owners[(d.generation, d.partition, d.offset)].add(d.member)
    assert owners, "no delivery was attributed to a generation, so the check below would prove nothing"
    shared = {k: v for k, v in owners.items() if len(v) > 1}
    assert not shared, f"records delivered to two members of one generation: {list(shared.items())[:3]}"


@pytest.mark.parametrize("lib", list(CLIENTS))
def test_members_share_partitions_and_hand_them_over_on_join_leave_and_kill(group_broker, lib):
    share_join_leave_kill(group_broker.bootstrap, lib)


def share_join_leave_kill(bootstrap: str, lib: str, **extra) -> None:
    """Two members, a third joins and leaves, one in another process joins and is killed; records keep coming and
    check_deliveries judges every delivery. extra: client settings of members a and b."""
    topic, group = f"shared-{lib}", f"group-{lib}"
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, 0, 120)
    a = ThreadMember(lib, bootstrap, topic, group, "a", **extra)
    b = ThreadMember(lib, bootstrap, topic, group, "b", **extra)
    members = [a, b]
    killed = None
    try:
        wait_balanced([a, b], "two members")
        produced += produce(bootstrap, topic, 120, 120)
        c = ThreadMember(lib, bootstrap, topic, group, "c")
        members.append(c)
        wait_balanced([a, b, c], "a third member joined")
        produced += produce(bootstrap, topic, 240, 120)
        wait_delivered(members, produced)
        c.leave()
        wait_balanced([a, b], "the third member left")
        produced += produce(bootstrap, topic, 360, 120)
        killed = ProcessMember(lib, bootstrap, topic, group, "k")
        members.append(killed)
        wait_balanced([a, b, killed], "a member in another process joined")
        produced += produce(bootstrap, topic, 480, 120)
        wait_delivered(members, produced)
        killed.kill()
        wait_balanced([a, b], "the killed member's session expired")
        produced += produce(bootstrap, topic, 600, 120)
        wait_delivered(members, produced)
    finally:
        if killed is not None and killed.proc.poll() is None:
            killed.kill()
        for m in (a, b):
            m.leave()
    assert a.log.error is None and b.log.error is None
    assert killed.log.deliveries, "the killed member never got records"
    check_deliveries(members, produced)
