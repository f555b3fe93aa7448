"""Hand-made Fetch requests for raw-socket tests (long polls, errored partitions, padded requests)."""
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
