"""The pipeline's output topics: created with the partitions asked for when missing, else taken as they are."""
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 30.0


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> int:
    """Create `topic` if it does not exist; return its partition count."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # All topics: asking for this one by name would have the broker auto-create it with its default partitions.
    existing = admin.list_topics(timeout=TIMEOUT_S).topics.get(topic)
    if existing is not None and existing.error is None and existing.partitions:
        return len(existing.partitions)
    future = admin.create_topics([NewTopic(topic, num_partitions=partitions)], request_timeout=TIMEOUT_S)[topic]
    try:
        future.result(TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # created meanwhile by another job: take it as it is
            raise
        return ensure_topic(bootstrap, topic, partitions)
    return partitions
