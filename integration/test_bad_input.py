"""Hostile and malformed input over raw sockets: the broker answers with the right error code or closes that one
connection, keeps serving everyone else, and stored data is untouched."""
import socket
import struct
import time

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from integration.clients import ck_produce, kp_consume_all


def connect(broker) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    sock.settimeout(10)
    return sock


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def roundtrip(sock, request, version, correlation_id=1):
    request.with_header(correlation_id=correlation_id, client_id="raw-test")
    sock.sendall(request.encode(header=True, framed=True))
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    return recv_exact(sock, size)


def is_closed(sock, wait=5.0) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def still_serves(broker):
    sock = connect(broker)
    data = roundtrip(sock, ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    resp = ApiVersionsResponse.decode(data, version=3, header=True)
    sock.close()
    return resp.error_code == 0


def produce_request(topic, partition_records, version=9):
    req = ProduceRequest[version](
        transactional_id=None, acks=-1, timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=r)
            for p, r in partition_records])])
    return req


def produce(sock, topic, partition_records, version=9):
    data = roundtrip(sock, produce_request(topic, partition_records, version), version)
    resp = ProduceResponse.decode(data, version=version, header=True)
    return {p.index: p for t in resp.responses for p in t.partition_responses}


def make_topic(broker, name, partitions=2):
    from kafka.admin import KafkaAdminClient, NewTopic
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    admin.close()


def _batch(values):
    from kafka.record.default_records import DefaultRecordBatchBuilder
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, v in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=v, headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("size", [-1, -2**31, 2**31 - 1, 200 * 1024 * 1024])
def test_absurd_frame_sizes_close_only_that_connection(broker, size):
    sock = connect(broker)
    sock.sendall(struct.pack(">i", size) + b"\x00" * 16)
    assert is_closed(sock)
    assert still_serves(broker)


def test_unknown_api_key_closes_the_connection(broker):
    sock = connect(broker)
    body = struct.pack(">hhih", 9999, 0, 7, 1) + b"x"
    sock.sendall(struct.pack(">i", len(body)) + body)
    assert is_closed(sock)
    assert still_serves(broker)


def test_truncated_and_garbage_requests(broker):
    sock = connect(broker)
    sock.sendall(struct.pack(">i", 100) + b"\x00\x03\x00\x09")  # then vanish mid-request
    sock.close()
    sock = connect(broker)
    body = struct.pack(">hhih", 3, 9, 1, 1) + b"x" + b"\xff" * 40  # Metadata v9 with a garbage body
    sock.sendall(struct.pack(">i", len(body)) + body)
    assert is_closed(sock)
    sock = connect(broker)
    sock.sendall(struct.pack(">i", 3) + b"\x00\x12\x00")  # shorter than a header
    assert is_closed(sock)
    assert still_serves(broker)


def test_unsupported_api_versions_version_gets_error_35_and_the_v0_list(broker):
    sock = connect(broker)
    body = struct.pack(">hhih", 18, 99, 5, 1) + b"x"
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    resp = ApiVersionsResponse.decode(recv_exact(sock, size), version=0, header=True)
    assert resp.error_code == 35
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert keys[18][1] >= 3 and 0 in keys and 1 in keys
    assert not is_closed(sock, wait=0.5)


def test_unsupported_version_of_another_api_closes_the_connection(broker):
    sock = connect(broker)
    body = struct.pack(">hhih", 0, 1, 5, 1) + b"x"  # Produce v1 (magic 0/1 era) is not served
    sock.sendall(struct.pack(">i", len(body)) + body)
    assert is_closed(sock)


def test_corrupt_batch_is_rejected_for_its_partition_only(broker):
    make_topic(broker, "bad-crc")
    good = _batch([b"good"])
    bad = bytearray(_batch([b"evil"]))
    bad[-1] ^= 0x55  # a flipped bit in the records: CRC mismatch
    sock = connect(broker)
    result = produce(sock, "bad-crc", [(0, bytes(bad)), (1, good)])
    assert result[0].error_code == 2  # CORRUPT_MESSAGE
    assert result[0].error_message
    assert result[1].error_code == 0 and result[1].base_offset == 0
    assert not is_closed(sock, wait=0.2)
    from integration.clients import ck_consume_all
    assert ck_consume_all(broker.bootstrap, "bad-crc", 1, partitions=(0,), timeout=3) == []


def test_magic_v1_message_sets_are_refused_with_a_reason(broker):
    make_topic(broker, "old-magic", 1)
    # a v1 message: offset, size, crc, magic=1, attributes, timestamp, key, value
    msg = struct.pack(">bbq", 1, 0, 0) + struct.pack(">i", -1) + struct.pack(">i", 1) + b"x"
    msg = struct.pack(">I", 0) + msg
    message_set = struct.pack(">qi", 0, len(msg)) + msg
    sock = connect(broker)
    result = produce(sock, "old-magic", [(0, message_set)])
    assert result[0].error_code != 0
    assert "magic" in (result[0].error_message or "").lower()


def test_produce_to_unknown_partition_and_invalid_acks(broker):
    make_topic(broker, "known", 1)
    sock = connect(broker)
    result = produce(sock, "known", [(5, _batch([b"x"]))])
    assert result[5].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    req = produce_request("known", [(0, _batch([b"x"]))])
    req.acks = 2
    data = roundtrip(sock, req, 9)
    resp = ProduceResponse.decode(data, version=9, header=True)
    assert resp.responses[0].partition_responses[0].error_code == 21  # INVALID_REQUIRED_ACKS


def test_invalid_topic_names_are_refused(broker):
    sock = connect(broker)
    req = MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(name="bad/name")],
                             allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    data = roundtrip(sock, req, 9)
    resp = MetadataResponse.decode(data, version=9, header=True)
    assert resp.topics[0].error_code == 17  # INVALID_TOPIC_EXCEPTION


def test_a_thousand_idle_connections_do_not_stop_service(broker):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    idle = [connect(broker) for _ in range(1000)]
    try:
        reports = ck_produce(broker.bootstrap, "busy", [(None, b"v%d" % i, [], 1_700_000_000_000) for i in range(20)])
        assert all(err is None for err, *_ in reports)
        assert len(kp_consume_all(broker.bootstrap, "busy", 20)) == 20
    finally:
        for s in idle:
            s.close()


def test_a_client_that_never_reads_does_not_block_others(broker):
    make_topic(broker, "slow", 1)
    ck_produce(broker.bootstrap, "slow", [(None, b"x" * 100_000, [], 1_700_000_000_000) for _ in range(30)])
    from kafka.protocol.consumer import FetchRequest
    sock = connect(broker)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for i in range(50):  # pipeline fetches and never read the responses
        req = FetchRequest[11](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=50 << 20, isolation_level=0,
                               session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                   topic="slow", partitions=[FetchRequest.FetchTopic.FetchPartition(
                                       partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                                       partition_max_bytes=10 << 20)])], forgotten_topics_data=[], rack_id="")
        req.with_header(correlation_id=i, client_id="slow")
        try:
            sock.settimeout(0.2)
            sock.sendall(req.encode(header=True, framed=True))
        except (socket.timeout, BlockingIOError):
            break
    start = time.monotonic()
    assert still_serves(broker)
    assert len(kp_consume_all(broker.bootstrap, "slow", 30)) == 30
    assert time.monotonic() - start < 30
    sock.close()
