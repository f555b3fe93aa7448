"""transform: a kop topic -> a user function -> another kop topic, with Structured Streaming's checkpointed offsets
(the Reader pattern: the positions read are stored with the job, and a batch is re-run from them after a crash).

An output record's producer name is the job's name and its input's topic-partition; its sequence id is derived from
its input record's offset and its index among that record's outputs. A batch re-run from an old checkpoint, or the
whole input re-read without one, republishes the same records under the same ids, which kop drops as duplicates.

The user function takes the micro-batch as Spark's Kafka source gives it (key, value, topic, partition, offset,
timestamp, ...) and returns key and value, keeping each output's input `partition` and `offset` columns. It must be
deterministic: the same input record always yields the same outputs."""
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from kop.spark.faults import Faults
from kop.spark.options import OptionError
from kop.spark.sequencing import PRODUCER_NAME, SEQUENCE_ID, sink_rows
from kop.spark.session import kafka_source
from kop.spark.sink import save
from kop.spark.topics import ensure_topic

UserFunction = Callable[[DataFrame], DataFrame]
OUTPUTS_PER_RECORD = 1 << 16  # sequence id = input offset * this + index among that input's outputs


@dataclass(frozen=True)
class TransformJob:
    name: str
    input_topic: str
    output_topic: str
    bootstrap: str
    checkpoint: str
    function: UserFunction
    partitions: int = 4  # of the output topic, when the job creates it
    sequence_ids: bool = True
    starting_offsets: str = "earliest"
    kafka_options: dict[str, str] = field(default_factory=dict)


@dataclass
class TransformResult:
    batches: int = 0
    records_in: int = 0
    records_out: int = 0


def load_function(spec: str) -> UserFunction:
    """`package.module:function`."""
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise OptionError(f"expected MODULE:FUNCTION, got {spec!r}")
    function = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(function):
        raise OptionError(f"{spec}: no such function")
    return function


def sequenced_outputs(batch: DataFrame, job_name: str, input_topic: str, function: UserFunction) -> DataFrame:
    """The user function's outputs of `batch` with their producer names and sequence ids."""
    outputs = function(batch)
    missing = {"key", "value", "partition", "offset"} - set(outputs.columns)
    if missing:
        raise OptionError(f"the transform function's output lacks {', '.join(sorted(missing))} (it must keep each "
                          f"output's input partition and offset)")
    # Outputs of one input record are numbered in the order of their content, so a re-run numbers them alike.
    per_input = Window.partitionBy("partition", "offset").orderBy("key", "value")
    index = F.row_number().over(per_input) - 1
    checked_index = F.when(index < OUTPUTS_PER_RECORD, index).otherwise(
        F.raise_error(F.lit(f"an input record has more than {OUTPUTS_PER_RECORD} outputs")))
    return outputs.select(
        F.concat(F.lit(f"{job_name}/{input_topic}-"), F.col("partition").cast("string")).alias(PRODUCER_NAME),
        (F.col("offset") * OUTPUTS_PER_RECORD + checked_index).alias(SEQUENCE_ID), "key", "value")


def expected_outputs(spark: SparkSession, job_name: str, input_topic: str, bootstrap: str,
                     function: UserFunction) -> DataFrame:
    """What a transform job should have written for everything now in its input topic (for the audit)."""
    inputs = (kafka_source(spark, bootstrap, input_topic).option("startingOffsets", "earliest")
              .option("endingOffsets", "latest").load())
    return sequenced_outputs(inputs, job_name, input_topic, function)


def run_transform(spark: SparkSession, job: TransformJob, faults: Faults = Faults()) -> TransformResult:
    """Process everything in the input topic now (Trigger.AvailableNow) and stop."""
    partitions = ensure_topic(job.bootstrap, job.output_topic, job.partitions)
    result = TransformResult()

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.cache()  # read the input once for the outputs and the count
        outputs = sequenced_outputs(batch, job.name, job.input_topic, job.function).cache()
        save(sink_rows(outputs, partitions, job.sequence_ids), job.bootstrap, job.output_topic, job.kafka_options,
             faults)
        result.batches += 1
        result.records_in += batch.count()
        result.records_out += outputs.count()
        outputs.unpersist()
        batch.unpersist()

    stream = (kafka_source(spark, job.bootstrap, job.input_topic, stream=True)
              .option("startingOffsets", job.starting_offsets).load())
    query = (stream.writeStream.foreachBatch(write_batch).option("checkpointLocation", job.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return result
