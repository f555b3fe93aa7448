"""Writing rows to a topic through Spark's Kafka sink when it is on the classpath, else kop's data source."""
from pyspark.sql import DataFrame

from kop.spark.session import kafka_format


def save(rows: DataFrame, bootstrap: str, topic: str, kafka_options: dict[str, str]) -> None:
    writer = rows.write.format(kafka_format(rows.sparkSession)).option("kafka.bootstrap.servers", bootstrap)
    for key, value in kafka_options.items():
        writer = writer.option(f"kafka.{key}", value)
    writer.option("topic", topic).mode("append").save()
