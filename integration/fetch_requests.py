"""Hand-made Fetch requests for raw-socket tests (long polls, errored partitions, padded requests, fetch
sessions)."""
import uuid
from dataclasses import dataclass

from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
from protocol.records import iter_records, split_batches

FETCH_VERSION = 11


def fetch_request(partitions, *, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, partition_max_bytes=1 << 20,
                  forgotten=(), isolation_level=0):
    """A Fetch v11 for [(topic, partition, offset), ...] (isolation_level 1: read_committed). `forgotten` lists topic names for the forgotten-topics
    list, which a broker without fetch sessions ignores: a way to make a request large without making it costly."""
    request_cls = REQUEST_CLASSES[1][FETCH_VERSION]
    by_topic = {}
    for topic, partition, offset in partitions:
        by_topic.setdefault(topic, []).append(request_cls.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
            partition_max_bytes=partition_max_bytes))
    return request_cls(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                       isolation_level=isolation_level, session_id=0, session_epoch=-1, rack_id="",
                       forgotten_topics_data=[request_cls.ForgottenTopic(topic=t, partitions=[0]) for t in forgotten],
                       topics=[request_cls.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()])


def fetch_answers(raw, correlation_id) -> dict[tuple[str, int], tuple[int, list[bytes | None]]]:
    """{(topic, partition): (error code, record values)} of the Fetch response to `correlation_id` (a RawKafka)."""
    response = raw.receive(correlation_id, RESPONSE_CLASSES[1], FETCH_VERSION)
    return {(t.topic, p.partition_index): (p.error_code, [r.value for _, view in split_batches(bytes(p.records or b""))
                                                         for r in iter_records(view)])
            for t in response.responses for p in t.partitions}


# ---- fetch sessions (KIP-227): requests that name a session, and what their answers say

@dataclass(frozen=True, slots=True)
class SessionAnswer:
    """A Fetch answer: its top-level error, the session id it names, and per partition (keyed by topic name, or by
    topic id from v13) the error, high watermark and record values."""

    error: int
    session_id: int
    partitions: dict[tuple[str | uuid.UUID, int], tuple[int, int, list[bytes | None]]]


def session_fetch(raw, version: int, session_id: int, epoch: int, partitions=(), *, forgotten=(), max_wait_ms=0,
                  min_bytes=0, max_bytes=1 << 20, partition_max_bytes=1 << 20) -> SessionAnswer:
    """One Fetch of `version` (7 and later) carrying (session_id, epoch): `partitions` are (topic, partition,
    offset) and `forgotten` (topic, partition), a topic being its name before v13 and its uuid.UUID from v13."""
    correlation_id = send_session_fetch(raw, version, session_id, epoch, partitions, forgotten=forgotten,
                                        max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                                        partition_max_bytes=partition_max_bytes)
    return receive_session_answer(raw, correlation_id, version)


def send_session_fetch(raw, version: int, session_id: int, epoch: int, partitions=(), *, forgotten=(),
                       max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, partition_max_bytes=1 << 20) -> int:
    cls = REQUEST_CLASSES[1][version]
    field = "topic_id" if version >= 13 else "topic"
    by_topic: dict = {}
    for topic, partition, offset in partitions:
        by_topic.setdefault(topic, []).append(cls.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
            partition_max_bytes=partition_max_bytes))
    forgotten_by_topic: dict = {}
    for topic, partition in forgotten:
        forgotten_by_topic.setdefault(topic, []).append(partition)
    fields = dict(max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0,
                  session_id=session_id, session_epoch=epoch, rack_id="",
                  forgotten_topics_data=[cls.ForgottenTopic(**{field: t}, partitions=ps)
                                         for t, ps in forgotten_by_topic.items()],
                  topics=[cls.FetchTopic(**{field: t}, partitions=ps) for t, ps in by_topic.items()])
    if version < 15:
        fields["replica_id"] = -1
    return raw.send(cls(**fields))


def receive_session_answer(raw, correlation_id: int, version: int) -> SessionAnswer:
    response = raw.receive(correlation_id, RESPONSE_CLASSES[1], version)
    partitions = {}
    for t in response.responses:
        topic = t.topic_id if version >= 13 else t.topic
        for p in t.partitions:
            values = [r.value for _, view in split_batches(bytes(p.records or b"")) for r in iter_records(view)]
            partitions[(topic, p.partition_index)] = (p.error_code, p.high_watermark, values)
    return SessionAnswer(response.error_code, response.session_id, partitions)
