"""Transactional produce against idempotent produce, and read_committed against read_uncommitted consume.

Produce: a confluent-kafka producer (acks=all, 1 KB records, 4 partitions) writes the same records idempotently and
in transactions of 1, 100 and 10,000 records; each variant on a fresh broker, variants interleaved round after
round. Commit latency is the time commit_transaction() takes (it flushes the transaction's records first, then
EndTxn, which writes a marker in every partition). Consume: a topic written in transactions of 100 records, one in
ten aborted, read from the beginning with each isolation level, alternating, on one broker.

    python -m bench.transactions --records 100000 --rounds 3
"""
import argparse
import time
from dataclasses import dataclass

from bench import machine
from bench.brokers import RDKAFKA_LOG, create_topic, running_broker
from bench.procstat import cpu_seconds
from bench.produce import payloads, PAYLOAD_POOL
from bench.report import Table, fmt, print_tables
from bench.stats import interleaved_order, median, paired_ratios, percentile

TOPIC = "bench-txn"
PARTITIONS = 4
IDEMPOTENT = 0  # the transaction size of the baseline: no transactions at all


@dataclass(frozen=True, slots=True)
class TxnProduceResult:
    transaction_records: int  # 0: idempotent, no transactions
    records: int
    seconds: float
    commit_ms: list[float]
    broker_cpu_s: float

    @property
    def label(self) -> str:
        return "idempotent" if not self.transaction_records else f"transactions of {self.transaction_records:,}"

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_s_per_100k(self) -> float:
        return self.broker_cpu_s / self.records * 100_000


def produce(bootstrap: str, records: int, record_bytes: int, transaction_records: int, broker_pid: int,
            transactional_id: str = "bench", aborted_every: int = 0) -> TxnProduceResult:
    """Write `records` round-robin over the topic's partitions, in transactions of `transaction_records` (0: no
    transactions, idempotent); every `aborted_every`-th transaction is aborted (0: none)."""
    from confluent_kafka import Producer
    config = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True,
              "logger": RDKAFKA_LOG}
    if transaction_records:
        config["transactional.id"] = transactional_id
    producer = Producer(config)
    if transaction_records:
        producer.init_transactions(30)
    values = payloads(record_bytes)
    commit_ms: list[float] = []
    cpu_before = cpu_seconds(broker_pid)
    start = time.perf_counter()
    step = transaction_records or records
    for first in range(0, records, step):
        if transaction_records:
            producer.begin_transaction()
        for i in range(first, min(first + step, records)):
            while True:
                try:
                    producer.produce(TOPIC, values[i % PAYLOAD_POOL], partition=i % PARTITIONS)
                    break
                except BufferError:  # the client's queue is full
                    producer.poll(0.005)
            if i % 100 == 0:
                producer.poll(0)
        if transaction_records:
            began = time.perf_counter()
            if aborted_every and (first // step) % aborted_every == aborted_every - 1:
                producer.flush(60)  # stored first: an abort drops the records it has not sent
                producer.abort_transaction(60)
            else:
                producer.commit_transaction(60)
            commit_ms.append((time.perf_counter() - began) * 1000)
    if producer.flush(60):
        raise TimeoutError("records undelivered after 60 s")
    seconds = time.perf_counter() - start
    broker_cpu = cpu_seconds(broker_pid) - cpu_before
    del producer
    return TxnProduceResult(transaction_records, records, seconds, commit_ms, broker_cpu)


def produce_on_fresh_broker(records: int, record_bytes: int, transaction_records: int) -> TxnProduceResult:
    with running_broker() as broker:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        return produce(broker.bootstrap, records, record_bytes, transaction_records, broker.proc.pid)


def records_for(transaction_records: int, records: int) -> int:
    """Transactions of one record commit one by one: fewer of them, so a round stays in minutes."""
    return min(records, 2_000) if transaction_records == 1 else records


def run_produce(records: int, record_bytes: int, sizes: list[int], rounds: int,
                progress=print) -> list[list[TxnProduceResult]]:
    variants = [IDEMPOTENT, *sizes]
    results: list[list[TxnProduceResult]] = [[] for _ in variants]
    for r in range(rounds):
        for v in interleaved_order(len(variants), r):
            result = produce_on_fresh_broker(records_for(variants[v], records), record_bytes, variants[v])
            results[v].append(result)
            progress(f"  round {r + 1}/{rounds} {result.label}: {result.records_per_s:,.0f} rec/s")
    return results


def produce_table(results: list[list[TxnProduceResult]], record_bytes: int) -> Table:
    t = Table(f"transactional produce, {record_bytes} B records, {PARTITIONS} partitions ({machine.describe()})",
              ["variant", "records", "rec/s", "rec/s vs idempotent", "commit p50 ms", "commit p99 ms",
               "CPU s/100k rec", "CPU/rec vs idempotent"])
    baseline = results[0]
    for runs in results:
        commits = [ms for r in runs for ms in r.commit_ms]
        t.add(runs[0].label, f"{runs[0].records:,}", fmt(median([r.records_per_s for r in runs])),
              f"{median(paired_ratios([r.records_per_s for r in runs], [b.records_per_s for b in baseline])):.3f}",
              fmt(percentile(commits, 0.50), 1) if commits else "-",
              fmt(percentile(commits, 0.99), 1) if commits else "-",
              fmt(median([r.cpu_s_per_100k for r in runs]), 2),
              f"{median(paired_ratios([r.cpu_s_per_100k for r in runs], [b.cpu_s_per_100k for b in baseline])):.3f}")
    t.notes.append(f"{len(baseline)} rounds, medians (commit percentiles over every round's commits); a fresh broker "
                   "per run; fsync and dedup on")
    return t


@dataclass(frozen=True, slots=True)
class IsolationResult:
    isolation: str
    records: int
    seconds: float
    broker_cpu_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def consume(bootstrap: str, isolation: str, broker_pid: int, timeout_s: float = 300.0) -> IsolationResult:
    """Read every partition from the beginning to its end (the last stable offset for read_committed)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-isolation", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True, "logger": RDKAFKA_LOG})
    try:
        consumer.list_topics(TOPIC, timeout=30)
        deadline = time.monotonic() + timeout_s
        cpu_before = cpu_seconds(broker_pid)
        start = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        seen, at_end = 0, set()
        while len(at_end) < PARTITIONS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{isolation}: {seen} records in {timeout_s}s, partitions {at_end} at their end")
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error() is None:
                    seen += 1
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
        return IsolationResult(isolation, seen, time.perf_counter() - start, cpu_seconds(broker_pid) - cpu_before)
    finally:
        consumer.close()


def run_consume(records: int, record_bytes: int, rounds: int, progress=print) -> list[list[IsolationResult]]:
    levels = ["read_uncommitted", "read_committed"]
    results: list[list[IsolationResult]] = [[], []]
    with running_broker() as broker:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        loaded = produce(broker.bootstrap, records, record_bytes, 100, broker.proc.pid, aborted_every=10)
        progress(f"  loaded {loaded.records:,} records in transactions of 100, one in ten aborted")
        for r in range(rounds):
            for v in interleaved_order(2, r):
                result = consume(broker.bootstrap, levels[v], broker.proc.pid)
                results[v].append(result)
                progress(f"  round {r + 1}/{rounds} {levels[v]}: {result.records:,} records, "
                         f"{result.records_per_s:,.0f} rec/s")
    return results


def consume_table(results: list[list[IsolationResult]], record_bytes: int) -> Table:
    t = Table(f"consume by isolation level, {record_bytes} B records ({machine.describe()})",
              ["isolation", "records read", "rec/s", "rec/s vs read_uncommitted", "broker CPU s"])
    for runs in results:
        t.add(runs[0].isolation, f"{runs[0].records:,}", fmt(median([r.records_per_s for r in runs])),
              f"{median(paired_ratios([r.records_per_s for r in runs], [b.records_per_s for b in results[0]])):.3f}",
              fmt(median([r.broker_cpu_s for r in runs]), 2))
    t.notes.append("one topic, written in transactions of 100 records with one in ten aborted (read_committed skips "
                   f"them); {len(results[0])} rounds alternating, medians; assign() from the beginning")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transactions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1000, help="record value bytes")
    parser.add_argument("--transaction-sizes", default="1,100,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.transaction_sizes.split(",")]
    tables = [produce_table(run_produce(args.records, args.size, sizes, args.rounds), args.size),
              consume_table(run_consume(args.records, args.size, args.rounds), args.size)]
    print_tables(tables, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
