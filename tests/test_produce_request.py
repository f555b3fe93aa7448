"""The hand-written Produce request decoder reads exactly what kafka-python's schema-driven decoder reads, and
refuses what it cannot read."""
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceRequest as Reference

from protocol.produce_request import MAX_VERSION, MIN_VERSION, MalformedRequest, decode_produce_request

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)
TOPIC_IDS_FROM = 13


def encode(version: int, transactional_id, acks: int, timeout_ms: int, topics) -> bytes:
    """kafka-python's bytes of a request; topics: [(name, [(index, records or None)])]."""
    cls = Reference[version]
    T, P = cls.TopicProduceData, cls.TopicProduceData.PartitionProduceData
    topic_data = [T(**({"topic_id": uuid.uuid5(uuid.NAMESPACE_DNS, name)} if version >= TOPIC_IDS_FROM
                       else {"name": name}),
                    partition_data=[P(index=i, records=r) for i, r in partitions]) for name, partitions in topics]
    request = cls(transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, topic_data=topic_data)
    return bytes(request.encode(version=version))


def as_plain(request) -> tuple:
    """The fields both decoders give, in a form that compares equal across them."""
    topics = []
    for t in request.topic_data:
        key = t.topic_id if request.version >= TOPIC_IDS_FROM else t.name
        topics.append((key, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data]))
    return request.transactional_id, request.acks, request.timeout_ms, topics


def assert_same(body: bytes, version: int) -> None:
    expected = Reference.decode(memoryview(body), version=version)
    assert as_plain(decode_produce_request(memoryview(body), version)) == as_plain(expected)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_single_batch_request_decodes_as_kafka_python_decodes_it(version):
    body = encode(version, None, -1, 30000, [("orders", [(3, b"\x00" * 70)])])
    assert_same(body, version)
    decoded = decode_produce_request(memoryview(body), version)
    assert isinstance(decoded.topic_data[0].partition_data[0].records, memoryview)  # a view of the frame, no copy


@pytest.mark.parametrize("version", VERSIONS)
def test_several_topics_null_records_transactional_ids_and_non_ascii_names(version):
    body = encode(version, "tx-é", 1, -1, [("clé", [(0, b"abc"), (1, None), (2, b"")]), ("", []),
                                            ("t" * 300, [(7, b"x" * 200)])])
    assert_same(body, version)


names = st.text(min_size=0, max_size=20)
partitions = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.one_of(st.none(), st.binary(max_size=40))),
                      max_size=4)


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), transactional_id=st.one_of(st.none(), names),
       acks=st.integers(-2**15, 2**15 - 1), timeout_ms=st.integers(-2**31, 2**31 - 1),
       topics=st.lists(st.tuples(names, partitions), max_size=3))
def test_random_requests_decode_alike(version, transactional_id, acks, timeout_ms, topics):
    assert_same(encode(version, transactional_id, acks, timeout_ms, topics), version)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 9])
def test_tagged_fields_are_skipped_at_every_level(version):
    body = bytearray(encode(version, None, -1, 1000, [("t", [(0, b"abc")])]))
    # The last three bytes are the empty tagged-field sections of the partition, the topic and the request: give
    # each one unknown tag (tag 5, 2 bytes), as a newer client might send.
    tagged = b"\x01\x05\x02zz"
    assert body[-3:] == b"\x00\x00\x00"
    patched = bytes(body[:-3]) + tagged * 3
    assert_same(patched, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_refused(version):
    body = encode(version, "tx", -1, 1000, [("orders", [(0, b"abcdef"), (1, None)])])
    for cut in range(len(body)):
        with pytest.raises(MalformedRequest):
            decode_produce_request(memoryview(body[:cut]), version)
        with pytest.raises(Exception):  # the reference refuses them too (with assorted errors)
            Reference.decode(memoryview(body[:cut]), version=version)


@pytest.mark.parametrize("version", [3, 9])
def test_lying_lengths_are_refused_without_allocating_for_them(version):
    body = bytearray(encode(version, None, -1, 1000, [("orders", [(0, b"abc")])]))
    if version < 9:
        body[8:12] = (2**31 - 1).to_bytes(4, "big")  # the topic count
    else:
        body[7:12] = b"\xff\xff\xff\xff\x07"  # the topic count, as a compact length of 2**31 - 1
    with pytest.raises(MalformedRequest):
        decode_produce_request(memoryview(bytes(body)), version)


def test_bytes_after_the_request_are_ignored_as_kafka_python_ignores_them():
    body = encode(3, None, -1, 1000, [("orders", [(0, b"abc")])]) + b"trailing"
    assert_same(body, 3)


@pytest.mark.parametrize("tagged", [b"\x00", b"\x01\x03\x02ab"])
def test_a_flexible_request_header_with_or_without_tagged_fields_ends_where_its_body_begins(tagged):
    from protocol.api import parse_header
    body = encode(9, None, -1, 1000, [("orders", [(0, b"abc")])])
    frame = b"\x00\x00\x00\x09\x00\x00\x00\x2a\x00\x03cli" + tagged + body
    header, offset = parse_header(frame, {0: (3, 13)})
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (0, 9, 42, "cli")
    assert frame[offset:] == body


def test_every_api_reads_its_request_header_as_kafka_python_says_its_versions_are_flexible():
    from protocol import api
    for key, cls in api.REQUEST_CLASSES.items():
        for version in range(0, 40):
            assert (version >= api._FLEXIBLE_FROM[key]) == cls.flexible_version_q(version), (cls.__name__, version)
