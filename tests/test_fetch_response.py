"""The hand-written Fetch response encoder writes exactly the bytes kafka-python's schema-driven encoder writes, with
the records as the buffers they are (never joined)."""
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse as Reference

from protocol.api import encode_response
from protocol.fetch_response import (MAX_VERSION, MIN_VERSION, AbortedTransaction, FetchableTopicResponse,
                                     FetchResponse, PartitionData, encode_fetch_response)
from protocol.records import Record, build_batch

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)
TOPIC_IDS_FROM = 13


def reference_bytes(response: FetchResponse, correlation_id: int) -> bytes:
    cls = Reference[response.version]
    Partition = cls.FetchableTopicResponse.PartitionData
    topics = []
    for topic in response.responses:
        partitions = [Partition(
            partition_index=p.partition_index, error_code=p.error_code, high_watermark=p.high_watermark,
            last_stable_offset=p.last_stable_offset, log_start_offset=p.log_start_offset,
            aborted_transactions=None if p.aborted_transactions is None else [
                Partition.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                for a in p.aborted_transactions],
            preferred_read_replica=p.preferred_read_replica, records=b"".join(p.records))
            for p in topic.partitions]
        key = {"topic_id": topic.topic} if isinstance(topic.topic, uuid.UUID) else {"topic": topic.topic}
        topics.append(cls.FetchableTopicResponse(**key, partitions=partitions))
    fields = {"throttle_time_ms": response.throttle_time_ms, "responses": topics}
    if response.version >= 7:
        fields.update(error_code=response.error_code, session_id=response.session_id)
    return encode_response(cls(**fields), correlation_id)


def fields_the_version_has(response: FetchResponse) -> FetchResponse:
    """Fields a version does not carry are not encoded by either side; the comparison needs them at their default."""
    v = response.version
    for topic in response.responses:
        for p in topic.partitions:
            if v < 5:
                p.log_start_offset = -1
            if v < 11:
                p.preferred_read_replica = -1
    if v < 7:
        response.error_code = response.session_id = 0
    return response


def batches(count: int, value_bytes: int) -> list[memoryview]:
    return [memoryview(build_batch([Record(i, 1_000, None, bytes([i % 256]) * value_bytes)], base_offset=i))
            for i in range(count)]


_int32 = st.integers(-2**31, 2**31 - 1)
_int64 = st.integers(-2**63, 2**63 - 1)


@st.composite
def partition_data(draw):
    records = batches(draw(st.integers(0, 3)), draw(st.sampled_from([0, 10, 200, 5000])))
    aborted = draw(st.none() | st.lists(st.builds(AbortedTransaction, _int64, _int64), max_size=3))
    return PartitionData(draw(_int32), draw(st.integers(-2**15, 2**15 - 1)), draw(_int64), draw(_int64),
                         draw(_int64), aborted, records, sum(len(r) for r in records), draw(_int32))


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), correlation_id=_int32, throttle=_int32,
       error_code=st.integers(-2**15, 2**15 - 1), session_id=_int32,
       topics=st.lists(st.tuples(st.text(max_size=150), st.lists(partition_data(), max_size=4)), max_size=4))
def test_any_response_is_byte_identical(version, correlation_id, throttle, error_code, session_id, topics):
    response = fields_the_version_has(FetchResponse(version, throttle, error_code, session_id, [
        FetchableTopicResponse(uuid.uuid5(uuid.NAMESPACE_DNS, name) if version >= TOPIC_IDS_FROM else name,
                               partitions) for name, partitions in topics]))
    parts = encode_fetch_response(response, correlation_id)
    assert b"".join(parts) == reference_bytes(response, correlation_id)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_records_are_written_as_the_buffers_they_are(version):
    records = batches(3, 1000)
    topic = "t" if version < TOPIC_IDS_FROM else uuid.uuid4()
    response = FetchResponse(version, responses=[FetchableTopicResponse(topic, [
        PartitionData(0, 0, 3, 3, 0, [], records, sum(map(len, records))),
        PartitionData(1, 0, 0, 0, 0, None)])])
    parts = encode_fetch_response(response, 7)
    assert [part for part in parts if part in records] == records
    assert all(any(part is r for r in records) for part in parts if isinstance(part, memoryview))
    assert b"".join(parts) == reference_bytes(response, 7)


def test_versions_not_served_and_topics_named_the_wrong_way_are_refused():
    for version in (MIN_VERSION - 1, MAX_VERSION + 1):
        with pytest.raises(ValueError):
            encode_fetch_response(FetchResponse(version), 1)
    with pytest.raises(ValueError):
        encode_fetch_response(FetchResponse(13, responses=[FetchableTopicResponse("by-name", [])]), 1)
    with pytest.raises(ValueError):
        encode_fetch_response(FetchResponse(12, responses=[FetchableTopicResponse(uuid.uuid4(), [])]), 1)
