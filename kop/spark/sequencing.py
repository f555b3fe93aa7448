"""Turns records that carry a producer name and a sequence id into rows for a Kafka sink (`kafka` or `kop`).

Per-record deduplication needs three things of the writer, and this module gives them whatever Spark does to the rows
before: each record goes to a partition that depends on the record alone (Kafka's murmur2 of the key, as Spark's
sink and the Java client place keys; for a record without key, the hash of its name and sequence id, where they would
pick a partition at random), so a re-run sends it to the same partition; all records of a name are written by one task
(one producer), in sequence order, so they reach every partition in order; and the headers carry name and id."""
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType

from kafka.partitioner.default import murmur2
from kop.client.sequences import MAX_PRODUCER_NAME_BYTES, PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER

PRODUCER_NAME = "producer_name"
SEQUENCE_ID = "sequence_id"


def kafka_partition(key: bytes | None, producer_name: str, sequence_id: int, partitions: int) -> int:
    hashed = key if key is not None else f"{producer_name}/{sequence_id}".encode()
    return (murmur2(hashed) & 0x7FFFFFFF) % partitions


def target_partition(partitions: int) -> Column:
    """The partition of a record with columns key (binary), producer_name and sequence_id."""
    partition_of = F.udf(lambda key, name, seq: kafka_partition(key, name, seq, partitions), IntegerType())
    return partition_of(F.col("key").cast("binary"), F.col(PRODUCER_NAME), F.col(SEQUENCE_ID))


def sink_rows(records: DataFrame, partitions: int, sequence_ids: bool = True) -> DataFrame:
    """`records` has producer_name, sequence_id, key and value: the rows to write, with partition and headers
    (none when `sequence_ids` is off: the at-least-once control), one task per group of names, in sequence order."""
    rows = records.select(
        PRODUCER_NAME, SEQUENCE_ID, F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"), target_partition(partitions).alias("partition"),
        _headers() if sequence_ids else F.lit(None).cast("array<struct<key: string, value: binary>>")
        .alias("headers"))
    tasks = max(1, records.sparkSession.sparkContext.defaultParallelism)
    return (rows.repartition(tasks, PRODUCER_NAME).sortWithinPartitions(PRODUCER_NAME, SEQUENCE_ID)
            .drop(PRODUCER_NAME, SEQUENCE_ID))


def _headers() -> Column:
    name = F.col(PRODUCER_NAME)
    checked_name = F.when(F.octet_length(name).between(1, MAX_PRODUCER_NAME_BYTES), name).otherwise(
        F.raise_error(F.concat(F.lit(f"a producer name must have 1 to {MAX_PRODUCER_NAME_BYTES} bytes: "), name)))
    return F.array(
        F.struct(F.lit(PRODUCER_NAME_HEADER).alias("key"), checked_name.cast("binary").alias("value")),
        F.struct(F.lit(SEQUENCE_ID_HEADER).alias("key"), F.col(SEQUENCE_ID).cast("string").cast("binary")
                 .alias("value")),
    ).alias("headers")
