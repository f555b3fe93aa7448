"""Spark's built-in Kafka sink is at least once: a task that fails after writing part of its rows is retried and
writes them all again, through the same cached producer, so Kafka's idempotence (same producer, new sends) does not
see duplicates. With the rows' sequence ids in headers, kop stores each row once; without them (the control), the
retried rows are stored twice. The sink is reproduced with the Java client configured as Spark's KafkaWriteTask
configures it (Spark's Kafka connector comes from Maven, which the test machines cannot reach)."""
from collections import Counter

import pytest

from integration.idem_raw import RawKafka, read_topic
from integration.java_client import java_available, java_spark_sink_retry, java_unavailable_reason

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())

TASKS, ROWS, PARTITIONS = 4, 500, 4
RETRIED = int(ROWS * 0.6)  # rows each task wrote before its first attempt failed


@pytest.mark.parametrize("sequence_headers", [True, False], ids=["with-sequence-ids", "control-without"])
def test_a_retried_spark_task_stores_each_row_once_with_sequence_ids(broker, sequence_headers):
    topic = f"spark-sink-{sequence_headers}"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic, PARTITIONS) == 0
    summary = java_spark_sink_retry(broker.bootstrap, topic, tasks=TASKS, rows=ROWS,
                                    sequence_headers=sequence_headers)
    assert summary["attempts"] == 2 * TASKS and summary["failed"] == 0
    assert summary["acked"] == summary["sent"] == TASKS * (ROWS + RETRIED)
    stored = Counter(r.value for r in read_topic(broker.port, topic, range(PARTITIONS)))
    assert set(stored) == {b"row-%d" % i for i in range(TASKS * ROWS)}  # nothing lost either way
    duplicates = sum(stored.values()) - len(stored)
    assert duplicates == (0 if sequence_headers else TASKS * RETRIED)
