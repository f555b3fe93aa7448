"""Application-chosen sequence ids: the two record headers that make kop deduplicate a record under a producer name
of the application's choosing (Pulsar's setProducerName + setSequenceId), and the last stored id per name
(Pulsar's getLastSequenceId), so a restarted source can seek past what is already stored.

    from kop.client.sequences import last_sequence_ids, sequence_headers

    stored = last_sequence_ids("http://127.0.0.1:8080", "orders", "loader/orders.jsonl")   # {partition: id}
    producer.produce("orders", value=line, headers=sequence_headers("loader/orders.jsonl", offset))
"""
import time

from kop.admin.client import AdminClient, AdminError, topic_resource
from protocol.sequence_headers import MAX_PRODUCER_NAME_BYTES, PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER

__all__ = ["MAX_PRODUCER_NAME_BYTES", "PRODUCER_NAME_HEADER", "SEQUENCE_ID_HEADER", "last_sequence_ids",
           "sequence_headers"]

RECOVERING = 503  # the admin API's answer while a partition's deduplication state is being rebuilt


def sequence_headers(producer_name: str, sequence_id: int) -> list[tuple[str, bytes]]:
    """The headers that mark one record as `sequence_id` of `producer_name`."""
    return [(PRODUCER_NAME_HEADER, producer_name.encode()), (SEQUENCE_ID_HEADER, str(sequence_id).encode())]


def last_sequence_ids(admin_url: str, topic: str, producer_name: str, *, wait: float = 30.0) -> dict[int, int]:
    """The highest sequence id kop stores for `producer_name`, per partition of `topic`; a partition where the name
    is unknown (never seen, purged, or deduplication off) is left out, never given a guess. While a partition's
    state is being recovered (after a restart) the broker cannot answer: this waits for it, up to `wait` seconds.

    The one place that knows the REST shape: `GET .../{topic}/sequences?producer=NAME` answering
    `{"partitions": {"0": 41, "1": null}}` (null: unknown)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            answer = AdminClient(admin_url).get(topic_resource(topic, "sequences"), producer=producer_name)
            break
        except AdminError as exc:
            if exc.status == 404 and exc.reason.startswith("Topic "):
                return {}  # no topic yet: nothing stored under any name
            if exc.status != RECOVERING or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
    return {int(partition): int(last) for partition, last in answer["partitions"].items() if last is not None}
