"""Application-chosen sequence ids: the two record headers that make kop deduplicate a record under a producer name
of the application's choosing (Pulsar's setProducerName + setSequenceId), and the last stored id per name
(Pulsar's getLastSequenceId), so a restarted source can seek past what is already stored."""
from kop.admin.client import AdminClient, AdminError, topic_resource

PRODUCER_NAME_HEADER = "kop.producer.name"
SEQUENCE_ID_HEADER = "kop.sequence.id"
MAX_PRODUCER_NAME_BYTES = 256


def sequence_headers(producer_name: str, sequence_id: int) -> list[tuple[str, bytes]]:
    """The headers that mark one record as `sequence_id` of `producer_name`."""
    return [(PRODUCER_NAME_HEADER, producer_name.encode()), (SEQUENCE_ID_HEADER, str(sequence_id).encode())]


def last_sequence_ids(admin_url: str, topic: str, producer_name: str) -> dict[int, int]:
    """The highest sequence id kop stores for `producer_name`, per partition of `topic`; a partition where the name
    is unknown (never seen, or purged) is left out, never given a guess.

    The one place that knows the REST shape: `GET .../{topic}/sequences?producer=NAME` answering
    `{"partitions": {"0": 41, "1": null}}` (null: unknown)."""
    try:
        answer = AdminClient(admin_url).get(topic_resource(topic, "sequences"), producer=producer_name)
    except AdminError as exc:
        if exc.status == 404 and exc.reason.startswith("Topic "):
            return {}  # no topic yet: nothing stored under any name
        raise
    return {int(partition): int(last) for partition, last in answer["partitions"].items() if last is not None}
