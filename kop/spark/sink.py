"""Writing rows to a topic through Spark's Kafka sink when it is on the classpath, else kop's data source."""
from pyspark.sql import DataFrame

from kop.spark.faults import Faults
from kop.spark.options import OptionError
from kop.spark.session import kafka_format


def save(rows: DataFrame, bootstrap: str, topic: str, kafka_options: dict[str, str], faults: Faults) -> None:
    fmt = kafka_format(rows.sparkSession)
    if fmt != "kop" and faults != Faults():
        raise OptionError("failure drills need kop's data source (Spark's Kafka connector is on the classpath)")
    writer = rows.write.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    for key, value in kafka_options.items():
        writer = writer.option(f"kafka.{key}", value)
    if fmt == "kop":
        writer = writer.options(**faults.sink_options())
    writer.option("topic", topic).mode("append").save()
