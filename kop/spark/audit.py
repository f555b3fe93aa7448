"""audit: read a topic back and compare it with what should be in it.

`expected` holds the records that should each be stored once (producer_name, sequence_id, key, value). Records are
matched by content (key and value), so the audit also counts the duplicates of a run without sequence ids; where the
stored records carry the sequence-id headers it also reports per producer name, and per partition the offsets left
as holes (records kop dropped as duplicates)."""
from dataclasses import asdict, dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kop.client.sequences import PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER
from kop.spark.offsets import TopicOffsets
from kop.spark.options import OffsetSpec, EARLIEST
from kop.spark.sequencing import PRODUCER_NAME, SEQUENCE_ID
from kop.spark.session import kafka_source


@dataclass(frozen=True)
class NameAudit:
    producer_name: str
    expected: int
    stored: int
    duplicates: int  # stored more than once under the same sequence id
    missing: int  # expected sequence ids not stored


@dataclass(frozen=True)
class PartitionAudit:
    partition: int
    records: int
    offsets: int  # from the log start to the end: records + holes
    holes: int  # offsets without a record: duplicates kop dropped


@dataclass(frozen=True)
class KeyAudit:
    key: str | None
    expected: int
    stored: int


@dataclass(frozen=True)
class AuditReport:
    topic: str
    expected: int
    stored: int
    duplicates: int  # stored copies beyond the expected ones, by content
    missing: int  # expected records not stored, by content
    without_sequence_ids: int  # stored records without the sequence-id headers
    names: list[NameAudit]
    partitions: list[PartitionAudit]
    keys: list[KeyAudit]

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0

    def as_dict(self) -> dict:
        return {**asdict(self), "exactly_once": self.exactly_once}


def read_topic(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    """Everything in `topic` now, with key and value as strings and the sequence-id headers as columns."""
    rows = (kafka_source(spark, bootstrap, topic).option("startingOffsets", "earliest")
            .option("endingOffsets", "latest").option("includeHeaders", "true").load())
    return rows.select(
        F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"), "partition",
        "offset", _header(PRODUCER_NAME_HEADER).alias(PRODUCER_NAME),
        _header(SEQUENCE_ID_HEADER).cast("long").alias(SEQUENCE_ID))


def audit(spark: SparkSession, expected: DataFrame, bootstrap: str, topic: str) -> AuditReport:
    expected = expected.select(PRODUCER_NAME, SEQUENCE_ID, F.col("key").cast("string").alias("key"),
                               F.col("value").cast("string").alias("value")).cache()
    stored = read_topic(spark, bootstrap, topic).cache()
    try:
        by_content = _by_content(expected, stored)
        return AuditReport(
            topic=topic, expected=expected.count(), stored=stored.count(),
            duplicates=by_content["duplicates"], missing=by_content["missing"],
            without_sequence_ids=stored.where(F.col(SEQUENCE_ID).isNull()).count(),
            names=_names(expected, stored), partitions=_partitions(stored, bootstrap, topic),
            keys=_keys(expected, stored))
    finally:
        expected.unpersist()
        stored.unpersist()


def _header(name: str):
    return F.try_element_at(F.filter("headers", lambda h: h["key"] == F.lit(name)), F.lit(1))["value"].cast("string")


def _by_content(expected: DataFrame, stored: DataFrame) -> dict[str, int]:
    tagged = (expected.select("key", "value", F.lit(1).alias("e"), F.lit(0).alias("s"))
              .unionByName(stored.select("key", "value", F.lit(0).alias("e"), F.lit(1).alias("s"))))
    counts = tagged.groupBy("key", "value").agg(F.sum("e").alias("e"), F.sum("s").alias("s"))
    totals = counts.agg(F.sum(F.greatest(F.col("s") - F.col("e"), F.lit(0))).alias("duplicates"),
                        F.sum(F.greatest(F.col("e") - F.col("s"), F.lit(0))).alias("missing")).first()
    return {"duplicates": int(totals["duplicates"] or 0), "missing": int(totals["missing"] or 0)}


def _names(expected: DataFrame, stored: DataFrame) -> list[NameAudit]:
    named = stored.where(F.col(PRODUCER_NAME).isNotNull())
    if named.isEmpty():
        return []
    stored_ids = named.groupBy(PRODUCER_NAME).agg(
        F.count(F.lit(1)).alias("stored"), F.countDistinct(SEQUENCE_ID).alias("distinct_ids"))
    expected_ids = expected.groupBy(PRODUCER_NAME).agg(F.count(F.lit(1)).alias("expected"))
    missing = (expected.join(named, [PRODUCER_NAME, SEQUENCE_ID], "left_anti")
               .groupBy(PRODUCER_NAME).agg(F.count(F.lit(1)).alias("missing")))
    rows = (expected_ids.join(stored_ids, PRODUCER_NAME, "full").join(missing, PRODUCER_NAME, "left")
            .na.fill(0).orderBy(PRODUCER_NAME).collect())
    return [NameAudit(row[PRODUCER_NAME], row["expected"], row["stored"], row["stored"] - row["distinct_ids"],
                      row["missing"]) for row in rows]


def _partitions(stored: DataFrame, bootstrap: str, topic: str) -> list[PartitionAudit]:
    counts = {row["partition"]: row["count"] for row in stored.groupBy("partition").count().collect()}
    planner = TopicOffsets({"bootstrap.servers": bootstrap})
    try:
        low = planner.positions([topic], OffsetSpec(EARLIEST, {}))[topic]
        high = planner.latest([topic])[topic]
    finally:
        planner.close()
    audits = []
    for partition in sorted(high, key=int):
        offsets = high[partition] - low[partition]
        records = counts.get(int(partition), 0)
        audits.append(PartitionAudit(int(partition), records, offsets, offsets - records))
    return audits


def _keys(expected: DataFrame, stored: DataFrame) -> list[KeyAudit]:
    counts = (expected.select("key", F.lit(1).alias("e"), F.lit(0).alias("s"))
              .unionByName(stored.select("key", F.lit(0).alias("e"), F.lit(1).alias("s")))
              .groupBy("key").agg(F.sum("e").alias("expected"), F.sum("s").alias("stored"))
              .orderBy(F.col("key").asc_nulls_first()).collect())
    return [KeyAudit(row["key"], row["expected"], row["stored"]) for row in counts]
