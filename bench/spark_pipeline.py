"""The PySpark pipeline's throughput: kop's Spark data source against plain confluent-kafka in one process, and the
pipeline's ingest and transform steps end to end (Spark local[2], one fresh broker, fsync on as by default).

    python -m bench.spark_pipeline                 # 50,000 rows
    python -m bench.spark_pipeline --rows 200000 --markdown

Rows of the data source and client cases are 150-byte values with the two sequence-id headers; the pipeline rows
are generated orders (about 250 bytes of JSON each). Times include Spark's planning and task start-up, as a job
pays them, but not the JVM's start (one session is warmed up first)."""
import argparse
import os
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.brokers import RDKAFKA_LOG, create_topic, running_broker
from bench.report import Table, fmt
from kop.client.sequences import sequence_headers
from kop.spark.examples import enrich_and_aggregate, generate_orders
from kop.spark.ingest import IngestJob, run_ingest
from kop.spark.session import SparkSettings, spark_session
from kop.spark.transform import TransformJob, run_transform

PARTITIONS = 2
VALUE_BYTES = 150


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def client_write(bootstrap: str, topic: str, rows: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random", "linger.ms": 5, "logger": RDKAFKA_LOG})
    value = b"v" * VALUE_BYTES
    for i in range(rows):
        while True:
            try:
                producer.produce(topic, key=str(i % 100).encode(), value=value,
                                 headers=sequence_headers("bench", i))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("client write: records not acknowledged")


def client_read(bootstrap: str, topic: str, rows: int) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                         "logger": RDKAFKA_LOG})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen, deadline = 0, time.monotonic() + 300
    while seen < rows and time.monotonic() < deadline:
        seen += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    consumer.close()
    if seen < rows:
        raise RuntimeError(f"client read: {seen} of {rows} rows")


def spark_rows(spark, rows: int):
    frame = spark.range(rows).selectExpr(
        "cast(id % 100 as string) as key", f"repeat('v', {VALUE_BYTES}) as value",
        "array(named_struct('key', 'kop.producer.name', 'value', cast('bench' as binary)), "
        "named_struct('key', 'kop.sequence.id', 'value', cast(cast(id as string) as binary))) as headers")
    return frame.repartition(PARTITIONS).cache()


def run(rows: int) -> Table:
    table = Table(f"Spark pipeline throughput ({rows:,} rows, local[{PARTITIONS}])", ["case", "seconds", "rows/s"])
    with running_broker() as broker, tempfile.TemporaryDirectory() as work:
        spark = spark_session(SparkSettings(master=f"local[{PARTITIONS}]", app_name="kop-bench"))
        bootstrap = broker.bootstrap
        frame = spark_rows(spark, rows)
        frame.count()
        warm = "warm-up"
        create_topic(bootstrap, warm, PARTITIONS)
        frame.limit(100).write.format("kop").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", warm).mode("append").save()  # starts the Python workers
        for name in ("client", "datasource"):
            create_topic(bootstrap, name, PARTITIONS)
        cases = {
            "confluent-kafka write (1 producer)": lambda: client_write(bootstrap, "client", rows),
            "format(\"kop\") write": lambda: frame.write.format("kop").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", "datasource").mode("append").save(),
            "confluent-kafka read (1 consumer)": lambda: client_read(bootstrap, "client", rows),
            "format(\"kop\") read": lambda: spark.read.format("kop").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", "datasource").load().write.format("noop").mode("overwrite").save(),
        }
        for case, action in cases.items():
            seconds = timed(action)
            table.add(case, fmt(seconds, 2), fmt(rows / seconds))
        orders = os.path.join(work, "orders.jsonl")
        generate_orders(orders, rows, seed=1)
        ingest = IngestJob(name="bench", inputs=[orders], topic="orders", bootstrap=bootstrap, key_field="customer",
                           partitions=PARTITIONS)
        seconds = timed(lambda: run_ingest(spark, ingest))
        table.add("pipeline ingest (JSON lines -> topic)", fmt(seconds, 2), fmt(rows / seconds))
        transform = TransformJob(name="bench", input_topic="orders", output_topic="totals", bootstrap=bootstrap,
                                 checkpoint=os.path.join(work, "checkpoint"), function=enrich_and_aggregate,
                                 partitions=PARTITIONS)
        result = None

        def run_it() -> None:
            nonlocal result
            result = run_transform(spark, transform)

        seconds = timed(run_it)
        table.add(f"pipeline transform (orders -> {result.records_out:,} totals)", fmt(seconds, 2),
                  fmt(result.records_in / seconds))
        spark.stop()
    table.notes.append("rows/s of the transform counts input rows")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    table = run(args.rows)
    print(table.markdown() if args.markdown else table.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
