"""kop's Spark Python Data Source, format("kop"), against a real broker: batch writes and reads with every codec,
offset ranges, streaming reads that resume from their checkpoint, a write whose records the broker refuses, and
reads across the holes that deduplicated records leave in offsets."""
import pytest
from confluent_kafka import Producer
from pyspark.errors import PySparkException

from integration.clients import COMPRESSIONS
from integration.txn_clients import ck_open_transaction
from kop.client.sequences import sequence_headers
from kop.spark.drills import end_offsets
from kop.spark.sequencing import kafka_partition
from kop.spark.topics import ensure_topic

pytestmark = pytest.mark.slow  # Spark in local mode: minutes; make test-slow runs it

ROWS = 120


def write(spark, bootstrap: str, topic: str, rows: list[tuple], **options: str) -> None:
    frame = spark.createDataFrame(rows, "key string, value string, headers array<struct<key: string, value: binary>>")
    writer = frame.write.format("kop").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


def read(spark, bootstrap: str, topic: str, **options: str):
    reader = (spark.read.format("kop").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("includeHeaders", "true"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def sample_rows(n: int, prefix: str) -> list[tuple]:
    return [(None if i % 10 == 0 else f"key-{i % 7}", f"{prefix}-{i}", [("h", f"x{i}".encode())] if i % 2 else [])
            for i in range(n)]


@pytest.mark.parametrize("codec", COMPRESSIONS)
def test_batch_write_and_read_round_trip(spark, spark_broker, codec):
    topic = f"ds-roundtrip-{codec}"
    ensure_topic(spark_broker.bootstrap, topic, 3)
    rows = sample_rows(ROWS, codec)
    write(spark, spark_broker.bootstrap, topic, rows, **{"kafka.compression.type": codec})

    got = read(spark, spark_broker.bootstrap, topic).collect()
    assert sorted(((r.key and r.key.decode(), r.value.decode(), [(h.key, bytes(h.value)) for h in r.headers])
                   for r in got), key=repr) == sorted(rows, key=repr)
    for row in got:
        if row.key is not None:  # keyed records land where Java's default partitioner puts them
            assert row.partition == kafka_partition(bytes(row.key), "", 0, 3)
    assert {row.topic for row in got} == {topic}
    offsets = sorted((row.partition, row.offset) for row in got)
    assert len(set(offsets)) == ROWS


def test_read_between_explicit_offsets(spark, spark_broker):
    topic = "ds-ranges"
    ensure_topic(spark_broker.bootstrap, topic, 1)
    write(spark, spark_broker.bootstrap, topic, [(None, f"v-{i}", []) for i in range(50)])
    frame = read(spark, spark_broker.bootstrap, topic, startingOffsets=f'{{"{topic}": {{"0": 10}}}}',
                 endingOffsets=f'{{"{topic}": {{"0": 25}}}}')
    assert sorted(row.offset for row in frame.collect()) == list(range(10, 25))
    assert read(spark, spark_broker.bootstrap, topic, startingOffsets="latest").count() == 0


def test_bad_offsets_option_names_the_option(spark, spark_broker):
    with pytest.raises(PySparkException, match="startingOffsets"):
        read(spark, spark_broker.bootstrap, "ds-ranges", startingOffsets="yesterday").count()


def test_write_fails_when_the_broker_refuses_a_record(spark, spark_broker):
    """Every delivery report is checked before a task commits: a record over the broker's message.max.bytes (1 MiB;
    the producer's own limit raised) fails the task, its retries, and the job."""
    topic = "ds-refused"
    ensure_topic(spark_broker.bootstrap, topic, 1)
    rows = [(None, "small", []), (None, "x" * 1_500_000, [])]
    with pytest.raises(PySparkException, match="records failed"):
        write(spark, spark_broker.bootstrap, topic, rows, **{"kafka.message.max.bytes": "4000000"})


def test_streaming_read_resumes_from_its_checkpoint(spark, spark_broker, tmp_path):
    topic = "ds-stream"
    ensure_topic(spark_broker.bootstrap, topic, 2)
    checkpoint = str(tmp_path / "checkpoint")

    def run_stream() -> list[str]:
        seen: list[str] = []
        stream = (spark.readStream.format("kop").option("kafka.bootstrap.servers", spark_broker.bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest").load())
        query = (stream.writeStream.option("checkpointLocation", checkpoint)
                 .foreachBatch(lambda batch, _: seen.extend(r.value.decode() for r in batch.collect()))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        return seen

    write(spark, spark_broker.bootstrap, topic, [(f"k{i}", f"first-{i}", []) for i in range(40)])
    assert sorted(run_stream()) == sorted(f"first-{i}" for i in range(40))
    write(spark, spark_broker.bootstrap, topic, [(f"k{i}", f"second-{i}", []) for i in range(25)])
    assert sorted(run_stream()) == sorted(f"second-{i}" for i in range(25))
    assert run_stream() == []


def produce_with_sequence_ids(bootstrap: str, topic: str, name: str, sequence_ids: list[int]) -> None:
    """One idempotent producer sends the records in one batch (linger), each marked with its sequence id."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 200})
    for seq in sequence_ids:
        producer.produce(topic, value=f"{name}-{seq}".encode(), partition=0, headers=sequence_headers(name, seq))
    assert producer.flush(30) == 0


def test_reads_skip_holes_left_by_dropped_duplicates(spark, spark_broker, tmp_path):
    """Needs kop's per-record deduplication by sequence-id headers. The second batch's ids 8, 9 and 3 are duplicates:
    kop drops them and their offsets (10, 11 and the batch's last, 14) stay holes, the last one past the partition's
    last record. Batch and streaming reads return the stored records and end."""
    topic = "ds-holes"
    ensure_topic(spark_broker.bootstrap, topic, 1)
    produce_with_sequence_ids(spark_broker.bootstrap, topic, "loader", list(range(10)))
    produce_with_sequence_ids(spark_broker.bootstrap, topic, "loader", [8, 9, 10, 11, 3])
    assert end_offsets(spark_broker.bootstrap, topic) == 15
    expected = [(offset, f"loader-{offset}") for offset in range(10)] + [(12, "loader-10"), (13, "loader-11")]

    batch = read(spark, spark_broker.bootstrap, topic).collect()
    assert sorted((row.offset, row.value.decode()) for row in batch) == expected

    seen = []
    query = (spark.readStream.format("kop").option("kafka.bootstrap.servers", spark_broker.bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest").load().writeStream
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .foreachBatch(lambda frame, _: seen.extend((r.offset, r.value.decode()) for r in frame.collect()))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert sorted(seen) == expected


def test_reads_skip_aborted_transactions_and_end_before_an_open_one(spark, spark_broker):
    """A topic written by transactions: a read (read_committed unless kafka.isolation.level says otherwise) gets the
    committed records only, and `latest` stops at the last stable offset, so an open transaction's records come in
    a later read once it commits. Control: read_uncommitted gets them all."""
    topic = "ds-transactions"
    ensure_topic(spark_broker.bootstrap, topic, 1)
    ck_open_transaction(spark_broker.bootstrap, topic, "c", 3).commit_transaction(15)
    ck_open_transaction(spark_broker.bootstrap, topic, "a", 2).abort_transaction(15)
    still_open = ck_open_transaction(spark_broker.bootstrap, topic, "o", 2)
    ck_open_transaction(spark_broker.bootstrap, topic, "l", 1).commit_transaction(15)

    def read_values(**options: str) -> list[str]:
        return [row.value.decode() for row in read(spark, spark_broker.bootstrap, topic, **options).orderBy("offset")
                .collect()]

    assert read_values() == ["c0", "c1", "c2"]
    assert read_values(**{"kafka.isolation.level": "read_uncommitted"}) == ["c0", "c1", "c2", "a0", "a1", "o0", "o1",
                                                                            "l0"]
    still_open.commit_transaction(15)
    assert read_values() == ["c0", "c1", "c2", "o0", "o1", "l0"]

