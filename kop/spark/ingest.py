"""ingest: replayable input files -> a kop topic, each record once however often the job is killed and re-run.

A record's producer name is the job's name and its file's name; its sequence id is its position in the file (the
byte offset of its line for JSON lines and CSV, its row index for Parquet), which no re-run and no Spark partitioning
changes. An input may be a directory (as Spark writes a table: part files) or a glob pattern: each file in it is an
input of its own, with a name of its own, since positions start again in every file. With `resume`, the job first
asks kop for each name's last stored id and skips what is stored."""
import csv
import glob
import os
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kop.client.sequences import last_sequence_ids
from kop.spark.faults import Faults
from kop.spark.options import OptionError
from kop.spark.sequencing import PRODUCER_NAME, SEQUENCE_ID, sink_rows, target_partition
from kop.spark.sink import save
from kop.spark.topics import ensure_topic

FORMATS_BY_EXTENSION = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".csv": "csv", ".parquet": "parquet"}
TEXT_INPUT = ("org.apache.hadoop.mapreduce.lib.input.TextInputFormat", "org.apache.hadoop.io.LongWritable",
              "org.apache.hadoop.io.Text")


@dataclass(frozen=True)
class IngestJob:
    name: str
    inputs: list[str]
    topic: str
    bootstrap: str
    admin_url: str | None = None
    key_field: str | None = None
    partitions: int = 4  # of the topic, when the job creates it
    sequence_ids: bool = True  # off: plain at-least-once writes (the control that shows the duplicates)
    resume: bool = False
    kafka_options: dict[str, str] = field(default_factory=dict)  # extra producer properties, e.g. compression.type


@dataclass(frozen=True)
class IngestResult:
    records: int  # read from the inputs
    written: int  # handed to the sink (records minus those resume skipped)


def producer_name(job: str, path: str) -> str:
    """`job/file`, or `job/directory/file` for a file found in an input directory (its path below that directory's
    parent): the same file gets the same name in every run."""
    return f"{job}/{path}"


def input_files(inputs: list[str]) -> list[tuple[str, str]]:
    """(path, name part) of every file the inputs stand for: a file itself, each data file of a directory (files
    whose names start with '_' or '.' are Spark's and Hadoop's markers and checksums, not data), each match of a glob
    pattern."""
    files = []
    for given in inputs:
        if os.path.isdir(given):
            top = os.path.dirname(os.path.normpath(given))
            found = sorted(os.path.join(root, name) for root, _dirs, names in os.walk(given) for name in names
                           if not name.startswith(("_", ".")))
            if not found:
                raise OptionError(f"{given}: a directory with no data files")
            files += [(path, os.path.relpath(path, top)) for path in found]
        elif not os.path.exists(given) and glob.has_magic(given):
            matches = sorted(path for path in glob.glob(given) if os.path.isfile(path))
            if not matches:
                raise OptionError(f"{given}: no file matches")
            files += [(path, os.path.basename(path)) for path in matches]
        else:
            files.append((given, os.path.basename(given)))
    return files


def source_records(spark: SparkSession, job: IngestJob) -> DataFrame:
    """Every input record as (producer_name, sequence_id, key, value)."""
    files = input_files(job.inputs)
    names = [producer_name(job.name, part) for _, part in files]
    if len(set(names)) != len(names):
        raise OptionError("two inputs have the same file name, so they would share a producer name: rename one")
    frames = [_read_file(spark, path, name, job.key_field) for (path, _), name in zip(files, names)]
    records = frames[0]
    for frame in frames[1:]:
        records = records.unionByName(frame)
    return records


def run_ingest(spark: SparkSession, job: IngestJob, faults: Faults = Faults()) -> IngestResult:
    partitions = ensure_topic(job.bootstrap, job.topic, job.partitions)
    records = source_records(spark, job)
    total = records.count()
    if job.resume:
        records = _skip_stored(spark, records, job, partitions).cache()
    written = records.count() if job.resume else total
    save(sink_rows(records, partitions, job.sequence_ids), job.bootstrap, job.topic, job.kafka_options, faults)
    return IngestResult(records=total, written=written)


def _read_file(spark: SparkSession, path: str, name: str, key_field: str | None) -> DataFrame:
    extension = os.path.splitext(path)[1].lower()
    if extension not in FORMATS_BY_EXTENSION:
        raise OptionError(f"{path}: unknown input format (expected one of {', '.join(FORMATS_BY_EXTENSION)})")
    return READERS[FORMATS_BY_EXTENSION[extension]](spark, path, key_field).select(
        F.lit(name).alias(PRODUCER_NAME), SEQUENCE_ID, "key", "value")


def _lines(spark: SparkSession, path: str) -> DataFrame:
    """(sequence_id = byte offset of the line, line), whatever the file's splits."""
    pairs = spark.sparkContext.newAPIHadoopFile(os.path.abspath(path), *TEXT_INPUT)
    return spark.createDataFrame(pairs.filter(lambda pair: pair[1].strip()), f"{SEQUENCE_ID} long, line string")


def _json_lines(spark: SparkSession, path: str, key_field: str | None) -> DataFrame:
    key = F.get_json_object("line", f"$.{key_field}") if key_field else F.lit(None).cast("string")
    return _lines(spark, path).select(SEQUENCE_ID, key.alias("key"), F.col("line").alias("value"))


def _csv(spark: SparkSession, path: str, key_field: str | None) -> DataFrame:
    """The first line names the columns; every other line is one record (values as strings), written as JSON."""
    with open(path, newline="") as f:
        columns = next(csv.reader(f), None)
    if not columns:
        raise OptionError(f"{path}: a CSV input needs a header line")
    if key_field is not None and key_field not in columns:
        raise OptionError(f"{path}: no column {key_field!r} for the key (columns: {', '.join(columns)})")
    schema = ", ".join(f"`{c}` string" for c in columns)
    parsed = _lines(spark, path).where(F.col(SEQUENCE_ID) > 0).select(
        SEQUENCE_ID, F.from_csv("line", schema).alias("row"))
    key = F.col("row").getField(key_field) if key_field else F.lit(None).cast("string")
    return parsed.select(SEQUENCE_ID, key.alias("key"), F.to_json("row").alias("value"))


def _parquet(spark: SparkSession, path: str, key_field: str | None) -> DataFrame:
    table = spark.read.parquet(path)
    row = F.struct(*[F.col(c) for c in table.columns])
    key = F.col(key_field).cast("string") if key_field else F.lit(None).cast("string")
    return table.select(F.col("_metadata.row_index").alias(SEQUENCE_ID), key.alias("key"),
                        F.to_json(row).alias("value"))


READERS = {"json": _json_lines, "csv": _csv, "parquet": _parquet}


def _skip_stored(spark: SparkSession, records: DataFrame, job: IngestJob, partitions: int) -> DataFrame:
    """Drop the records kop already stores: a record is stored if its id is at most the last id stored for its name
    on the partition it goes to (each name's records reach a partition in order)."""
    if not job.admin_url:
        raise OptionError("resume asks kop's admin API for the last sequence ids: give its URL")
    names = [row[0] for row in records.select(PRODUCER_NAME).distinct().collect()]
    stored = [(name, partition, last) for name in names
              for partition, last in last_sequence_ids(job.admin_url, job.topic, name).items()]
    if not stored:
        return records
    last_ids = spark.createDataFrame(stored, f"{PRODUCER_NAME} string, partition int, last_id long")
    keyed = records.withColumn("partition", target_partition(partitions))
    return (keyed.join(F.broadcast(last_ids), [PRODUCER_NAME, "partition"], "left")
            .where(F.col("last_id").isNull() | (F.col(SEQUENCE_ID) > F.col("last_id")))
            .drop("partition", "last_id"))
