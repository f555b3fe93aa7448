"""Requests whose bytes decode, but to null where Kafka's schema allows none: kafka-python reads any length -1 as
null, and a handler iterating a null array raised (the connection closed as an internal error). They are refused
as malformed, as Kafka's readers refuse them; a field the schema lets be null still decodes."""
import struct

import pytest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from kop.handlers import build_api_router
from protocol.api import ProtocolError, decode_body, parse_header

SERVED = build_api_router().versions


def decoded(frame: bytes):
    header, offset = parse_header(frame, SERVED)
    return decode_body(header, frame, offset)


def frame_of(request) -> bytes:
    request.with_header(correlation_id=1, client_id="t")
    return bytes(request.encode(header=True, framed=False))


def header(api_key: int, version: int) -> bytes:
    return struct.pack(">hhih", api_key, version, 1, 1) + b"t"


def test_a_null_array_where_the_schema_allows_none_is_malformed():
    with pytest.raises(ProtocolError, match="ListOffsetsRequest v1: topics is null"):
        decoded(header(2, 1) + struct.pack(">ii", -1, -1))  # replica id, then topics of length -1


def test_a_null_inside_an_element_is_found_and_named():
    request = ListOffsetsRequest[1](replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name="a",
                                                                                               partitions=[])])
    frame = frame_of(request)
    assert frame.endswith(b"\x00\x01a\x00\x00\x00\x00")  # name "a", then an empty partition array
    with pytest.raises(ProtocolError, match=r"topics\[0\]\.partitions is null"):
        decoded(frame[:-4] + struct.pack(">i", -1))
    with pytest.raises(ProtocolError, match=r"topics\[0\]\.name is null"):
        decoded(frame[:-7] + struct.pack(">hi", -1, 0))


def test_produce_refuses_the_same_nulls_in_its_own_decoder():
    """Produce is decoded by hand (protocol/produce_request.py): the same nulls are malformed there too."""
    request = ProduceRequest[7](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="a", partition_data=[])])
    frame = frame_of(request)
    assert frame.endswith(b"\x00\x01a\x00\x00\x00\x00")
    for bad in (frame[:-4] + struct.pack(">i", -1), frame[:-7] + struct.pack(">hi", -1, 0)):
        with pytest.raises(ProtocolError, match="malformed ProduceRequest v7"):
            decoded(bad)


def test_fields_the_schema_lets_be_null_still_decode():
    assert decoded(frame_of(MetadataRequest[4](topics=None, allow_auto_topic_creation=False))).topics is None
    request = ProduceRequest[7](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="a", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=None)])])
    assert decoded(frame_of(request)).topic_data[0].partition_data[0].records is None
    assert decoded(frame_of(ListOffsetsRequest[1](replica_id=-1, topics=[]))).topics == []
