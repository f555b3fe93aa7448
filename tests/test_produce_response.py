"""The hand-written Produce response encoder writes exactly the bytes kafka-python's schema-driven encoder writes."""
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.api import encode_response, response_class
from protocol.produce_response import MAX_VERSION, MIN_VERSION, PartitionResponse, ProduceResponse, \
    encode_produce_response

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)
TOPIC_IDS_FROM = 13


def topic_key(version: int, name: str) -> str | bytes:
    """How a version names a topic: by name, or from v13 by id (here one derived from the name)."""
    return uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes if version >= TOPIC_IDS_FROM else name


def by_key(key: str | bytes) -> dict:
    return {"topic_id": uuid.UUID(bytes=key)} if isinstance(key, bytes) else {"name": key}


def reference_bytes(response: ProduceResponse, correlation_id: int) -> bytes:
    cls = response_class(0, response.version)
    Partition = cls.TopicProduceResponse.PartitionProduceResponse
    topics = [cls.TopicProduceResponse(**by_key(key), partition_responses=[
        Partition(index=p.index, error_code=p.error_code, base_offset=p.base_offset,
                  log_append_time_ms=p.log_append_time_ms, log_start_offset=p.log_start_offset,
                  record_errors=[Partition.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                                 for i, m in p.record_errors],
                  error_message=p.error_message)
        for p in partitions]) for key, partitions in response.responses]
    return encode_response(cls(responses=topics, throttle_time_ms=response.throttle_time_ms), correlation_id)


def drop_fields_the_version_lacks(response: ProduceResponse) -> ProduceResponse:
    """Fields a version does not carry are not encoded by either side; the comparison needs them absent."""
    if response.version >= 8:
        return response
    return ProduceResponse(response.version, [
        (name, [PartitionResponse(p.index, p.error_code, p.base_offset, p.log_append_time_ms, p.log_start_offset)
                for p in partitions]) for name, partitions in response.responses], response.throttle_time_ms)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_usual_answer_is_byte_identical(version):
    response = ProduceResponse(version, [(topic_key(version, "orders"), [PartitionResponse(0, 0, 12345, -1, 0)])])
    assert encode_produce_response(response, 77) == reference_bytes(response, 77)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 8])
def test_record_errors_and_messages_are_byte_identical(version):
    response = ProduceResponse(version, [
        (topic_key(version, "compacted"), [PartitionResponse(3, 87, -1, -1, 5, [(0, "no key"), (4, None), (7, "clé manquante")],
                                         "compacted topic cannot accept records without a key")]),
        (topic_key(version, ""), [PartitionResponse(0, 6, -1, -1, -1, [], "")]),
    ], throttle_time_ms=12)
    assert encode_produce_response(response, -5) == reference_bytes(response, -5)


def test_versions_not_served_are_refused():
    with pytest.raises(ValueError):
        encode_produce_response(ProduceResponse(2, []), 1)
    with pytest.raises(ValueError):
        encode_produce_response(ProduceResponse(MAX_VERSION + 1, []), 1)


def test_a_topic_named_the_way_its_version_does_not_is_refused():
    with pytest.raises(ValueError):
        encode_produce_response(ProduceResponse(13, [("orders", [])]), 1)
    with pytest.raises(ValueError):
        encode_produce_response(ProduceResponse(12, [(b"\0" * 16, [])]), 1)


_int32 = st.integers(-2**31, 2**31 - 1)
_int64 = st.integers(-2**63, 2**63 - 1)
_text = st.text(max_size=200)  # long enough for multi-byte varint lengths
_partitions = st.builds(
    PartitionResponse, _int32, st.integers(-2**15, 2**15 - 1), _int64, _int64, _int64,
    st.lists(st.tuples(_int32, st.none() | _text), max_size=3), st.none() | _text)


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), correlation_id=_int32, throttle=_int32,
       responses=st.lists(st.tuples(st.text(max_size=150), st.lists(_partitions, max_size=4)), max_size=4))
def test_any_response_is_byte_identical(version, correlation_id, throttle, responses):
    responses = [(topic_key(version, name), partitions) for name, partitions in responses]
    response = drop_fields_the_version_lacks(ProduceResponse(version, responses, throttle))
    assert encode_produce_response(response, correlation_id) == reference_bytes(response, correlation_id)
