"""kop's Spark Python Data Source, `format("kop")`: Spark's Kafka source and sink for stock PySpark, with a Kafka
client (confluent-kafka) in the executors. Same options and schema as `format("kafka")`:

    spark.read.format("kop").option("kafka.bootstrap.servers", ...).option("subscribe", "t").load()
    df.write.format("kop").option("kafka.bootstrap.servers", ...).option("topic", "t").save()

Batch reads plan one task per partition with records between startingOffsets and endingOffsets; streaming reads
checkpoint {topic: {partition: next offset}} and support Trigger.AvailableNow. Reads are read_committed unless
kafka.isolation.level says otherwise: records of aborted transactions are skipped and `latest` is the last stable
offset, so a read ends before a transaction still open (Spark's own connector defaults to read_uncommitted). Writes take the columns key, value,
headers, partition and topic of Spark's Kafka sink."""
from collections.abc import Iterator

from pyspark import TaskContext
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter,
                                    InputPartition, WriterCommitMessage)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from kop.spark.faults import FAIL_AFTER_OPTION, ROW_DELAY_OPTION, Faults
from kop.spark.offsets import OffsetRange, Positions, TopicOffsets, ranges_between
from kop.spark.options import OptionError, flag, kafka_config, offset_spec, reader_config, subscribed_topics
from kop.spark.range_reader import read_range
from kop.spark.task_writer import WrittenRecord, write_records

SOURCE_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                 "timestampType int")
HEADERS_FIELD = "headers array<struct<key: string, value: binary>>"


class KopDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kop"

    def schema(self) -> str:
        return f"{SOURCE_SCHEMA}, {HEADERS_FIELD}" if flag(self.options, "includeHeaders") else SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KopBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KopStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return KopWriter(self.options, schema)


class RangePartition(InputPartition):
    def __init__(self, span: OffsetRange) -> None:
        super().__init__(span)
        self.span = span


class KopBatchReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.config = reader_config(options)
        self.include_headers = flag(options, "includeHeaders")
        topics = subscribed_topics(options)
        starting = offset_spec(options, "startingOffsets", "earliest")
        ending = offset_spec(options, "endingOffsets", "latest")
        planner = TopicOffsets(self.config)
        try:
            self.spans = ranges_between(planner.positions(topics, starting), planner.positions(topics, ending))
        finally:
            planner.close()

    def partitions(self) -> list[RangePartition]:
        return [RangePartition(span) for span in self.spans]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not isinstance(partition, RangePartition):
            return iter(())  # no range has records: Spark still runs one task, with a partition of its own
        return read_range(self.config, partition.span, self.include_headers)


class KopStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {topic: {partition: next offset}}; a micro-batch reads every partition from its previous end to
    the end kop reports now (or to the end fixed when an AvailableNow trigger started)."""

    def __init__(self, options) -> None:
        self.config = reader_config(options)
        self.include_headers = flag(options, "includeHeaders")
        self.topics = subscribed_topics(options)
        self.starting = offset_spec(options, "startingOffsets", "latest")
        if "endingOffsets" in options:
            raise OptionError("option endingOffsets is for batch reads only")
        self._planner: TopicOffsets | None = None
        self._target: Positions | None = None

    @property
    def planner(self) -> TopicOffsets:
        if self._planner is None:  # lazily: Spark pickles the reader to executors, a consumer cannot travel
            self._planner = TopicOffsets(self.config)
        return self._planner

    def initialOffset(self) -> Positions:
        return self.planner.positions(self.topics, self.starting)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.latest(self.topics)

    def latestOffset(self, start: Positions, limit: ReadLimit = ReadAllAvailable()) -> Positions:
        return self._target if self._target is not None else self.planner.latest(self.topics)

    def partitions(self, start: Positions, end: Positions) -> list[RangePartition]:
        return [RangePartition(span) for span in ranges_between(start, end)]

    def read(self, partition: RangePartition) -> Iterator[tuple]:
        return read_range(self.config, partition.span, self.include_headers)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_planner": None}


class WriteCommit(WriterCommitMessage):
    def __init__(self, records: int) -> None:
        self.records = records


class KopWriter(DataSourceWriter):
    def __init__(self, options, schema: StructType) -> None:
        self.config = kafka_config(options)
        self.topic = options.get("topic")
        names = set(schema.fieldNames())
        if "value" not in names:
            raise OptionError("the written DataFrame needs a value column (and may have key, headers, partition, "
                              "topic)")
        if self.topic is None and "topic" not in names:
            raise OptionError("set the option topic or give the DataFrame a topic column")
        # Failure drills (kop.spark.faults): a first attempt fails after storing this many records; rows are slowed.
        self.faults = Faults(int(options.get(FAIL_AFTER_OPTION, 0)), float(options.get(ROW_DELAY_OPTION, 0)))

    def write(self, rows: Iterator) -> WriteCommit:
        faults = self.faults
        if TaskContext.get().attemptNumber() > 0:
            faults = Faults(fail_after_rows=0, row_delay_ms=faults.row_delay_ms)
        return WriteCommit(write_records(self.config, (self._record(row) for row in rows), faults))

    def _record(self, row) -> WrittenRecord:
        fields = row.asDict()
        topic = self.topic or fields.get("topic")  # the option wins over the column, as in Spark's sink
        if topic is None:
            raise ValueError("a row has no topic and the option topic is not set")
        headers = fields.get("headers")
        return WrittenRecord(
            topic=topic, key=_as_bytes(fields.get("key")), value=_as_bytes(fields["value"]),
            headers=[(h["key"], _as_bytes(h["value"])) for h in headers] if headers else None,
            partition=fields.get("partition"))


def _as_bytes(value: str | bytes | bytearray | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else bytes(value)
