"""Writing rows to a topic through Spark's Kafka sink when it is on the classpath, else kop's data source."""
from pyspark.sql import DataFrame

from kop.spark.faults import Faults
from kop.spark.options import OptionError
from kop.spark.session import kafka_format


# Spark's connector writes through a cached Java producer that a retried task reuses. A record it gave up on (Java's
# default delivery timeout is two minutes) while a later record of its name got stored would be lost for good: its id
# is below the highest stored, so its retry is dropped as a duplicate. So it never gives one up, and keeps each name's
# records in order through its retries. kop's own data source sees to the same itself (kop/spark/task_writer.py).
CONNECTOR_PRODUCER_DEFAULTS = {"enable.idempotence": "true", "acks": "all", "delivery.timeout.ms": str(2**31 - 1)}


def producer_options(fmt: str, kafka_options: dict[str, str]) -> dict[str, str]:
    """The producer properties a sink of format `fmt` gets: the job's own over the connector's safe defaults."""
    return {**CONNECTOR_PRODUCER_DEFAULTS, **kafka_options} if fmt == "kafka" else dict(kafka_options)


def save(rows: DataFrame, bootstrap: str, topic: str, kafka_options: dict[str, str], faults: Faults) -> None:
    fmt = kafka_format(rows.sparkSession)
    if fmt != "kop" and faults != Faults():
        raise OptionError("failure drills need kop's data source (Spark's Kafka connector is on the classpath)")
    writer = rows.write.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    for key, value in producer_options(fmt, kafka_options).items():
        writer = writer.option(f"kafka.{key}", value)
    if fmt == "kop":
        writer = writer.options(**faults.sink_options())
    writer.option("topic", topic).mode("append").save()
