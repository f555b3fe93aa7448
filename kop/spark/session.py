"""The Spark session the pipeline runs in, and the choice between Spark's own Kafka connector and kop's data source."""
import os
import sys
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from kop.spark.datasource import KopDataSource

KAFKA_CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


@dataclass(frozen=True)
class SparkSettings:
    """How a pipeline job runs: master (`local[N,maxFailures]` retries failed tasks in local mode), speculative
    execution, and any further Spark configuration."""
    master: str = "local[2,4]"
    app_name: str = "kop-pipeline"
    speculation: bool = False
    conf: dict[str, str] = field(default_factory=dict)


def spark_session(settings: SparkSettings = SparkSettings()) -> SparkSession:
    """A session with kop's data source registered; the executors run this interpreter (it has the Kafka client)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(settings.master).appName(settings.app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")  # the pipeline shows its own progress
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.speculation", str(settings.speculation).lower()))
    for key, value in settings.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KopDataSource)
    return spark


def kafka_source(spark: SparkSession, bootstrap: str, topic: str, stream: bool = False):
    """A batch (or streaming) reader of `topic` in the Kafka source's format, reading committed records only: Spark's
    own connector reads with the Java consumer's default, read_uncommitted, which would hand a job the records of
    aborted transactions and of open ones."""
    reader = spark.readStream if stream else spark.read
    return (reader.format(kafka_format(spark)).option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("kafka.isolation.level", "read_committed"))


def kafka_format(spark: SparkSession) -> str:
    """`kafka` when Spark's Kafka connector (spark-sql-kafka) is on the classpath, else kop's `kop`: same options,
    same columns."""
    jvm = spark.sparkContext._jvm
    return "kafka" if jvm.org.apache.spark.util.Utils.classIsLoadable(KAFKA_CONNECTOR_CLASS) else "kop"
