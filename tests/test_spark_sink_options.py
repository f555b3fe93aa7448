"""The producer properties each sink gets: Spark's own Kafka connector never gives a record up and stays idempotent
unless the job says otherwise; kop's data source gets the job's properties as they are."""
import pytest

pytest.importorskip("pyspark")

from kop.spark.sink import producer_options  # noqa: E402


def test_the_connector_never_times_a_record_out_unless_the_job_says_so():
    options = producer_options("kafka", {"compression.type": "zstd"})
    assert options == {"enable.idempotence": "true", "acks": "all", "delivery.timeout.ms": "2147483647",
                       "compression.type": "zstd"}
    assert producer_options("kafka", {"delivery.timeout.ms": "600000"})["delivery.timeout.ms"] == "600000"


def test_kops_data_source_gets_the_jobs_properties_only():
    assert producer_options("kop", {"compression.type": "lz4"}) == {"compression.type": "lz4"}
