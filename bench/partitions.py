"""Many partitions on one broker: creating them, holding them (memory, descriptors), producing to all of them,
Metadata for all of them, and starting again after a clean stop and after kill -9.

    python -m bench.partitions                              # 1,000 topics x 10 partitions, 100 producers
    python -m bench.partitions --topics 100 --producers 10  # a quick look
"""
import argparse
import socket
import statistics
import struct
import sys
import threading
import time
from dataclasses import dataclass

from bench.brokers import RDKAFKA_LOG, running_broker
from bench.procstat import open_descriptors, rss_bytes
from bench.report import Table

CREATE_BATCH = 100  # topics per CreateTopics request


@dataclass(frozen=True)
class Spec:
    topics: int = 1000
    partitions: int = 10  # per topic
    producers: int = 100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def topic_names(spec: Spec) -> list[str]:
    return [f"bench-{i:05d}" for i in range(spec.topics)]


def create_all(bootstrap: str, spec: Spec) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG})
    names = topic_names(spec)
    started = time.perf_counter()
    for i in range(0, len(names), CREATE_BATCH):
        futures = admin.create_topics([NewTopic(n, spec.partitions, 1) for n in names[i:i + CREATE_BATCH]],
                                      operation_timeout=300, request_timeout=300)
        for future in futures.values():
            future.result(300)
    return time.perf_counter() - started


def produce_to_all(bootstrap: str, spec: Spec) -> float:
    """One record to every partition, the partitions shared out among `producers` idempotent producers that run
    at once (each in its own thread). Returns the seconds until every record is acknowledged."""
    from confluent_kafka import Producer
    names = topic_names(spec)
    targets = [(n, p) for n in names for p in range(spec.partitions)]
    shares = [targets[i::spec.producers] for i in range(spec.producers)]
    errors: list[str] = []

    def run(share):
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                             "logger": RDKAFKA_LOG})
        for topic, partition in share:
            producer.produce(topic, b"x" * 100, partition=partition,
                             on_delivery=lambda err, _m: err and errors.append(str(err)))
        if producer.flush(300):
            errors.append("not all delivered")

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(share,)) for share in shares if share]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} produce errors, first: {errors[0]}")
    return elapsed


def read_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise OSError("connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def metadata_seconds(bootstrap: str, expected: int, rounds: int = 5) -> float:
    """Median time until the whole answer to a Metadata request for every topic has arrived (a raw request, so no
    client cache and no client decoding in the figure; the answer is decoded afterwards to check it)."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse
    host, port = bootstrap.rsplit(":", 1)
    times = []
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        for i in range(rounds):
            request = MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False)
            request.with_header(correlation_id=i, client_id="bench")
            started = time.perf_counter()
            sock.sendall(request.encode(header=True, framed=True))
            body = read_exact(sock, struct.unpack(">i", read_exact(sock, 4))[0])
            times.append(time.perf_counter() - started)
            listed = len(MetadataResponse.decode(body, version=9, header=True).topics)
            if listed < expected:
                raise RuntimeError(f"metadata lists {listed} topics, expected {expected}")
    return statistics.median(times)


def seconds_until_serving(broker, spec: Spec) -> float:
    """Start the (stopped) broker; seconds until a Metadata request lists every topic."""
    started = time.perf_counter()
    broker.start(timeout=600)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            metadata_seconds(broker.bootstrap, spec.topics, rounds=1)
            return time.perf_counter() - started
        except (RuntimeError, OSError):
            time.sleep(0.2)
    raise RuntimeError("the broker did not serve every topic within 600 s")


def run(spec: Spec) -> Table:
    table = Table(f"{spec.topics:,} topics x {spec.partitions} partitions on one broker", ["measure", "value"])
    with running_broker() as broker:
        pid = broker.proc.pid
        empty_rss = rss_bytes(pid)
        log(f"creating {spec.topics * spec.partitions:,} partitions ...")
        created = create_all(broker.bootstrap, spec)
        partitions = spec.topics * spec.partitions
        table.add("create, partitions/s", f"{partitions / created:,.0f} ({created:.1f} s)")
        log("producing one record to each ...")
        produced = produce_to_all(broker.bootstrap, spec)
        table.add(f"one record to every partition from {spec.producers} producers", f"{produced:.1f} s")
        table.add("RSS per partition", f"{(rss_bytes(pid) - empty_rss) / partitions / 1024:.1f} KiB")
        table.add("open descriptors", f"{open_descriptors(pid):,}")
        table.add("Metadata for every topic (median of 5)", f"{metadata_seconds(broker.bootstrap, spec.topics) * 1e3:.0f} ms")
        broker.stop()
        table.add("start after a clean stop, until Metadata lists all", f"{seconds_until_serving(broker, spec):.1f} s")
        broker.kill()
        table.add("start after kill -9, until Metadata lists all", f"{seconds_until_serving(broker, spec):.1f} s")
        table.add("RSS after the restart, per partition", f"{(rss_bytes(broker.proc.pid) - empty_rss) / partitions / 1024:.1f} KiB")
        table.add("open descriptors after the restart", f"{open_descriptors(broker.proc.pid):,}")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=Spec.topics)
    parser.add_argument("--partitions", type=int, default=Spec.partitions, help="per topic")
    parser.add_argument("--producers", type=int, default=Spec.producers)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    table = run(Spec(args.topics, args.partitions, args.producers))
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
