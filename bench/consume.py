"""Consume throughput: preload a topic, then read all of it from the beginning with a confluent-kafka consumer.

The consumer uses assign() at OFFSET_BEGINNING on every partition (no consumer group). The topic is loaded once per
record size; each round reads it all again with a new consumer, and the table shows medians over rounds.

    python -m bench.consume --records 200000 --size 100 --rounds 3
"""
import argparse
import time
from dataclasses import dataclass

from bench import machine
from bench.brokers import RDKAFKA_LOG, create_topic, running_broker
from bench.produce import ProduceSpec, produce
from bench.procstat import cpu_seconds
from bench.report import Table, fmt
from bench.stats import median


@dataclass(frozen=True, slots=True)
class ConsumeResult:
    records: int
    value_bytes: int
    seconds: float  # assign() (leaders already known) to the last record
    broker_cpu_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.value_bytes / self.seconds / 1e6

    @property
    def cpu_s_per_100k(self) -> float:
        return self.broker_cpu_s / self.records * 100_000


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, broker_pid: int,
                timeout_s: float = 300.0) -> ConsumeResult:
    """Read the expected number of records from the start of every partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    # librdkafka insists on a group.id, but with assign() and no commits it never joins the group.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-consume", "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "logger": RDKAFKA_LOG})
    seen = value_bytes = 0
    try:
        # Learn the leaders first: assigned before that, librdkafka waits for its 500 ms offset-query timer.
        consumer.list_topics(topic, timeout=30)
        deadline = time.monotonic() + timeout_s
        cpu_before = cpu_seconds(broker_pid)
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while seen < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {seen} of {expected} records in {timeout_s}s")
            # consume() returns early only with num_messages in hand, so never ask for more than remain
            for msg in consumer.consume(num_messages=min(10_000, expected - seen), timeout=1.0):
                if msg.error() is None:
                    seen += 1
                    value_bytes += len(msg.value() or b"")
        seconds = time.perf_counter() - start
        broker_cpu = cpu_seconds(broker_pid) - cpu_before
    finally:
        consumer.close()
    return ConsumeResult(seen, value_bytes, seconds, broker_cpu)


def run(records: int, record_bytes: int, partitions: int, rounds: int, broker_config: dict[str, str] | None = None,
        progress=print) -> list[ConsumeResult]:
    topic = "bench-consume"
    with running_broker(broker_config) as broker:
        create_topic(broker.bootstrap, topic, partitions)
        # fast preload: no idempotence, lz4 off (the consumer reads what a plain producer writes)
        loaded = produce(broker.bootstrap, topic, ProduceSpec(records, record_bytes, partitions), broker.proc.pid)
        progress(f"  preloaded {loaded.delivered:,} x {record_bytes} B in {loaded.seconds:.1f}s")
        in_topic = loaded.delivered + partitions  # produce() also wrote one warm-up record per partition
        results = []
        for r in range(rounds):
            result = consume_all(broker.bootstrap, topic, partitions, in_topic, broker.proc.pid)
            results.append(result)
            progress(f"  round {r + 1}/{rounds}: {result.records_per_s:,.0f} rec/s, "
                     f"broker {result.cpu_s_per_100k:.2f} CPU s/100k")
        return results


def table(all_results: list[tuple[ProduceSpec, list[ConsumeResult]]], title: str) -> Table:
    t = Table(title, ["records", "rec/s", "MB/s", "broker CPU s", "broker busy", "CPU s/100k rec"])
    for spec, results in all_results:
        t.add(spec.shape, fmt(median([r.records_per_s for r in results])),
              fmt(median([r.mb_per_s for r in results]), 1), fmt(median([r.broker_cpu_s for r in results]), 2),
              f"{median([r.broker_cpu_s / r.seconds for r in results]):.0%}",
              fmt(median([r.cpu_s_per_100k for r in results]), 2))
    t.notes.append(f"{len(all_results[0][1])} rounds per size, medians; assign() from the beginning, no group")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.consume", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="record value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.records, args.size, args.partitions, args.rounds)
    t = table([(ProduceSpec(args.records, args.size, args.partitions), results)], f"consume ({machine.describe()})")
    print(t.markdown() if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
