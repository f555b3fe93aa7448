"""Geo-replication between two `kop standalone` processes on this machine (clusters east and west):

1. Catch-up throughput: east holds a backlog (replication off while it is written); replication is turned on and
   the time until west holds every record gives MB/s of record batches copied.
2. At a steady rate (one run per `--rate`): a producer in east sends at a fixed rate, each value carrying its send
   time; a consumer in west notes when each arrives: end-to-end p50/p99 (producer batching and consumer polling
   included), and MB/s replicated: how fast west's stored bytes grow over the measured window, beside east's.
3. Failover, per snapshot period: a replicated group consumes in east (auto-commit every 100 ms) while a producer
   keeps writing; east is killed -9; the same group.id starts in west. Measured: kill to the first record consumed in
   west (consumer start and group join included), the records west delivered that east had delivered already
   (duplicates), and whether every record west holds was consumed in one cluster or the other (no loss).

    python -m bench.geo_replication --backlog-mb 50 --rate 2000 --seconds 10 --periods 100,1000,5000
    python -m bench.geo_replication --parts steady --rate 2000,10000 --record-bytes 1000
"""
import argparse
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from bench import machine
from bench.brokers import RDKAFKA_LOG, create_topic
from bench.report import Table, fmt
from bench.stats import percentile
from integration.broker_process import BrokerProcess
from integration.geo import NAMESPACE, register
from kop.admin.client import AdminClient, group_resource, namespace_resource, topic_resource

TOPIC = "geo-bench"
PARTITIONS = 4
STAMP = struct.Struct(">q")  # the value's first 8 bytes: send time, ns since the epoch


@contextmanager
def two_clusters(config: dict[str, str] | None = None) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    root = tempfile.mkdtemp(prefix="kop-bench-geo-")
    brokers = {name: BrokerProcess(f"{root}/{name}", admin_port=0, options=("--cluster-name", name),
                                   config=dict(config or {})).start() for name in ("east", "west")}
    try:
        for broker in brokers.values():
            register(broker, brokers)
            create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        yield brokers["east"], brokers["west"]
    finally:
        for broker in brokers.values():
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def replicate(broker: BrokerProcess, clusters: list[str]) -> None:
    AdminClient(broker.admin_url).post(namespace_resource(NAMESPACE, "replication"), clusters)


def end_offsets(broker: BrokerProcess) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-offsets", "logger": RDKAFKA_LOG})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS))
    finally:
        consumer.close()


def producer(broker: BrokerProcess) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                     "logger": RDKAFKA_LOG})


# ---- 1. catch-up throughput

@dataclass(frozen=True)
class CatchUp:
    records: int
    megabytes: float
    seconds: float


def catch_up(backlog_mb: int, record_bytes: int = 1000) -> CatchUp:
    with two_clusters() as (east, west):
        count = backlog_mb * 1_000_000 // record_bytes
        p = producer(east)
        payload = b"x" * record_bytes
        for i in range(count):
            while True:
                try:
                    p.produce(TOPIC, payload, partition=i % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(120) == 0
        megabytes = AdminClient(east.admin_url).get(topic_resource(TOPIC, "stats"))["storageSize"] / 1e6
        started = time.monotonic()
        replicate(east, ["east", "west"])
        while end_offsets(west) < count:
            time.sleep(0.05)
        return CatchUp(count, megabytes, time.monotonic() - started)


# ---- 2. lag at a steady rate

WARM_UP_S = 1.0  # records sent in the first second are not counted (connections, the replicator's first request)


@dataclass(frozen=True)
class Steady:
    lags_ms: list[float]  # per record sent after the warm-up, produce-in-east to consume-in-west
    sent: int
    received: int
    east_mb_s: float  # growth of the topic's stored bytes over the measured window, per second
    west_mb_s: float


def stored_bytes(broker: BrokerProcess) -> int:
    return AdminClient(broker.admin_url).get(topic_resource(TOPIC, "stats"))["storageSize"]


def steady(rate: int, seconds: float, record_bytes: int = 200) -> Steady:
    """A producer in east at `rate` for `seconds`, a consumer in west; the window measured for MB/s runs from the
    warm-up's end to the producer's last send."""
    with two_clusters() as (east, west):
        replicate(east, ["east", "west"])
        consumer = Consumer({"bootstrap.servers": west.bootstrap, "group.id": "bench-lag", "logger": RDKAFKA_LOG,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        lags: list[float] = []
        sent = [0]
        counted_from = time.time_ns() + int(WARM_UP_S * 1e9)
        window: list[tuple[float, int, int]] = []  # (time, east's stored bytes, west's) at the window's two ends

        def sample() -> None:
            window.append((time.monotonic(), stored_bytes(east), stored_bytes(west)))

        def send() -> None:
            p, padding = producer(east), b"x" * (record_bytes - STAMP.size)
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds:
                if not window and elapsed >= WARM_UP_S:
                    sample()
                due = int(elapsed * rate)
                while sent[0] < due:
                    p.produce(TOPIC, STAMP.pack(time.time_ns()) + padding, partition=sent[0] % PARTITIONS)
                    sent[0] += 1
                p.poll(0)
                time.sleep(0.001)
            sample()  # east has what was sent by now, but for the producer's last linger
            p.flush(30)

        sender = threading.Thread(target=send)
        sender.start()
        deadline, received = time.monotonic() + seconds + 30, 0
        while time.monotonic() < deadline and (sender.is_alive() or received < sent[0]):
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    stamp = STAMP.unpack_from(message.value())[0]
                    received += 1
                    if stamp >= counted_from:
                        lags.append((time.time_ns() - stamp) / 1e6)
        sender.join()
        consumer.close()
        (t0, east0, west0), (t1, east1, west1) = window
        return Steady(lags, sent[0], received, (east1 - east0) / 1e6 / (t1 - t0), (west1 - west0) / 1e6 / (t1 - t0))


# ---- 3. failover

@dataclass(frozen=True)
class Failover:
    period_ms: int
    to_first_record_s: float
    duplicates: int
    consumed_in_east: int
    lost: int  # records west holds that neither cluster's consumer delivered


def _consume_until(consumer: Consumer, stop: threading.Event, out: list[bytes]) -> None:
    while not stop.is_set():
        for message in consumer.consume(500, 0.1):
            if message.error() is None:
                out.append(message.value())


def failover(period_ms: int, rate: int = 500) -> Failover:
    config = {"replicatedSubscriptionsSnapshotFrequencyMillis": str(period_ms)}
    with two_clusters(config) as (east, west):
        for broker in (east, west):
            replicate(broker, ["east", "west"])
        AdminClient(east.admin_url).post(group_resource("app", "replicated"), True)
        group = {"group.id": "app", "auto.offset.reset": "earliest", "enable.auto.commit": True,
                 "auto.commit.interval.ms": 100, "logger": RDKAFKA_LOG}
        writing, sent = threading.Event(), [0]

        def send() -> None:
            p = producer(east)
            while not writing.is_set():
                p.produce(TOPIC, b"%d" % sent[0], partition=sent[0] % PARTITIONS)
                sent[0] += 1
                p.poll(0)
                time.sleep(1 / rate)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        in_east: list[bytes] = []
        consumer = Consumer({"bootstrap.servers": east.bootstrap, **group})
        consumer.subscribe([TOPIC])
        stop = threading.Event()
        reader = threading.Thread(target=_consume_until, args=(consumer, stop, in_east))
        reader.start()
        time.sleep(max(3.0, 3 * period_ms / 1000))
        stop.set()
        reader.join()
        consumer.close()  # commits what it delivered
        time.sleep(max(0.5, 2 * period_ms / 1000))  # the last snapshot and update have time to land
        writing.set()
        sender.join()
        east.kill()
        killed = time.monotonic()
        in_west: list[bytes] = []
        consumer = Consumer({"bootstrap.servers": west.bootstrap, **group})
        consumer.subscribe([TOPIC])
        first = None
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 3:
            for message in consumer.consume(500, 0.1):
                if message.error() is None:
                    first = first or time.monotonic()
                    in_west.append(message.value())
                    idle_since = time.monotonic()
        consumer.close()
        lost = all_values(west) - set(in_east) - set(in_west)
        return Failover(period_ms, (first or float("nan")) - killed, len(set(in_west) & set(in_east)),
                        len(in_east), len(lost))


def all_values(broker: BrokerProcess) -> set[bytes]:
    """Every value the topic holds in this cluster."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-audit", "logger": RDKAFKA_LOG,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    wanted, values = end_offsets(broker), set()
    count, deadline = 0, time.monotonic() + 60
    while count < wanted and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.2):
            if message.error() is None:
                values.add(message.value())
                count += 1
    consumer.close()
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=int, default=50)
    parser.add_argument("--parts", default="catch-up,steady,failover", help="which measurements, comma-separated")
    parser.add_argument("--rate", default="2000", help="records/s of the steady runs, comma-separated: one run each")
    parser.add_argument("--record-bytes", type=int, default=200, help="record size of the steady runs")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--periods", default="100,1000,5000", help="snapshot periods (ms) for the failover runs")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(machine.describe())
    parts, tables = args.parts.split(","), []
    if "catch-up" in parts:
        done = catch_up(args.backlog_mb)
        tables.append(throughput := Table("Catch-up replication, east -> west (one request in flight per partition)",
                                          ["records", "MB stored in east", "seconds", "MB/s", "records/s"]))
        throughput.add(fmt(done.records), fmt(done.megabytes, 1), fmt(done.seconds, 2),
                       fmt(done.megabytes / done.seconds, 1), fmt(done.records / done.seconds))
    if "steady" in parts:
        tables.append(lag := Table(
            f"At a steady rate, records of {args.record_bytes:,} bytes for {args.seconds:.0f} s: MB/s stored in east "
            f"and replicated into west, and end-to-end lag, produce in east to consume in west (the first "
            f"{WARM_UP_S:.0f} s not counted)",
            ["records/s", "records sent", "received in west", "MB/s stored in east", "MB/s replicated into west",
             "p50 ms", "p99 ms", "max ms"]))
        for rate in (int(r) for r in args.rate.split(",")):
            run = steady(rate, args.seconds, args.record_bytes)
            lag.add(fmt(rate), fmt(run.sent), fmt(run.received), fmt(run.east_mb_s, 2), fmt(run.west_mb_s, 2),
                    fmt(percentile(run.lags_ms, 0.5), 1), fmt(percentile(run.lags_ms, 0.99), 1),
                    fmt(max(run.lags_ms), 1))
    if "failover" in parts:
        tables.append(failovers := Table("Group failover after kill -9 of east, per snapshot period",
                                         ["snapshot period ms", "kill to first record in west s", "consumed in east",
                                          "duplicates in west", "lost"]))
        for period in (int(p) for p in args.periods.split(",")):
            result = failover(period)
            failovers.add(fmt(period), fmt(result.to_first_record_s, 2), fmt(result.consumed_in_east),
                          fmt(result.duplicates), fmt(result.lost))
    for table in tables:
        print(table.markdown() if args.markdown else table.text())
        print()


if __name__ == "__main__":
    main()
