"""Hostile and malformed input over raw sockets: the broker answers with the right error code or closes that one
connection, keeps serving everyone else, and stored data is untouched."""
import contextlib
import os
import re
import resource
import socket
import struct
import threading
import time

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from integration.clients import ck_produce, kp_consume_all, sample_records
from integration.fetch_requests import fetch_answers, fetch_request
from integration.idem_raw import RawKafka, plain_batch, read_topic
from integration.waiting import wait_for
from protocol.errors import ErrorCode

REFERENCE_TOPIC = "stored-before-the-attack"
REFERENCE = {p: sample_records(12, prefix=f"p{p}") for p in (0, 1)}
LIVENESS_S = 60.0  # how long a test waits for what a working broker does at once


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


def frame_of(request, correlation_id=1) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="raw-test")
    return request.encode(header=True, framed=True)


def read_frame(sock) -> bytes:
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    return recv_exact(sock, size)


def roundtrip(sock, request, version, correlation_id=1):
    sock.sendall(frame_of(request, correlation_id))
    return read_frame(sock)


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
    return resp.error_code == ErrorCode.NONE


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


@contextlib.contextmanager
def stored_data_survives(broker):
    """Store reference records before the attack, and after it read them all back: hostile input must leave
    stored data exactly as it was (keys, values, headers, timestamps, offsets)."""
    make_topic(broker, REFERENCE_TOPIC)
    for partition, records in REFERENCE.items():
        reports = ck_produce(broker.bootstrap, REFERENCE_TOPIC, records, partition=partition)
        assert [err for err, *_ in reports] == [None] * len(records)
    yield
    expected = sorted((p, offset, key, value, tuple(headers), ts)
                      for p, records in REFERENCE.items() for offset, (key, value, headers, ts) in enumerate(records))
    got = kp_consume_all(broker.bootstrap, REFERENCE_TOPIC, len(expected))
    assert sorted((r.partition, r.offset, r.key, r.value, r.headers, r.timestamp) for r in got) == expected


@pytest.fixture
def broker(broker):
    """conftest's broker, holding reference data that each test here must leave intact."""
    with stored_data_survives(broker):
        yield broker


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


def test_client_telemetry_is_not_enabled_so_not_advertised_and_a_probe_closes_its_connection(broker):
    """As a Kafka broker without a client-metrics plugin: GetTelemetrySubscriptions (71) and PushTelemetry (72) are
    left out of ApiVersions (clients then push no metrics); one sent anyway closes only its connection."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    from integration.idem_raw import RawKafka
    with RawKafka(broker.port) as kafka:
        versions = kafka.call(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"),
                              ApiVersionsResponse, 3)
    advertised = {k.api_key for k in versions.api_keys}
    assert 75 in advertised and not advertised & {71, 72}
    sock = connect(broker)
    # GetTelemetrySubscriptions v0: header v2 (no tags), then a zero client instance id and no tags
    body = struct.pack(">hhih", 71, 0, 7, 1) + b"x" + b"\x00" + b"\x00" * 16 + b"\x00"
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


def test_unsupported_api_versions_version_gets_unsupported_version_and_the_v0_list(broker):
    sock = connect(broker)
    body = struct.pack(">hhih", 18, 99, 5, 1) + b"x"
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    resp = ApiVersionsResponse.decode(recv_exact(sock, size), version=0, header=True)
    assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION
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
    assert result[0].error_code == ErrorCode.CORRUPT_MESSAGE
    assert result[0].error_message
    assert result[1].error_code == ErrorCode.NONE and result[1].base_offset == 0
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
    assert result[0].error_code != ErrorCode.NONE
    assert "magic" in (result[0].error_message or "").lower()


def test_produce_to_unknown_partition_and_invalid_acks(broker):
    make_topic(broker, "known", 1)
    sock = connect(broker)
    result = produce(sock, "known", [(5, _batch([b"x"]))])
    assert result[5].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    req = produce_request("known", [(0, _batch([b"x"]))])
    req.acks = 2
    data = roundtrip(sock, req, 9)
    resp = ProduceResponse.decode(data, version=9, header=True)
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.INVALID_REQUIRED_ACKS


def test_invalid_topic_names_are_refused(broker):
    sock = connect(broker)
    req = MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(name="bad/name")],
                             allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    data = roundtrip(sock, req, 9)
    resp = MetadataResponse.decode(data, version=9, header=True)
    assert resp.topics[0].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


IDLE_CONNECTIONS = 1000
BROKER_START_OPEN_FILES = 256  # far below IDLE_CONNECTIONS: only the broker's own raise lets it keep them all


@contextlib.contextmanager
def open_files_soft_limit(soft):
    """This process's soft RLIMIT_NOFILE set to `soft` (a child started meanwhile inherits it), then restored."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


def open_files_limits(pid):
    """(soft, hard) 'Max open files' of a process, from /proc."""
    with open(f"/proc/{pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    return tuple(int(v) if v.isdigit() else v for v in line.split()[3:5])


def api_versions_on_every_socket(socks):
    """Pipelined: an ApiVersions request on each socket, then each answer read back (each read bounded)."""
    frame = frame_of(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 7)
    for sock in socks:
        sock.sendall(frame)
    answered = 0
    for sock in socks:
        response = ApiVersionsResponse.decode(read_frame(sock), version=3, header=True)
        answered += response.header.correlation_id == 7 and response.error_code == ErrorCode.NONE
    return answered


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="reads a process's limits from /proc (Linux)")
def test_a_thousand_idle_connections_do_not_stop_service(broker_factory):
    """The broker starts with a soft open-files limit far below 1,000 and must raise it itself; it then accepts and
    keeps 1,000 idle connections (each answers an ApiVersions at the end, which the kernel's accept backlog alone
    could not) while other clients produce and consume."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = IDLE_CONNECTIONS + 500  # the idle sockets plus this process's own files and clients
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard open-files limit {hard} is below the {needed} this test needs")
    with open_files_soft_limit(needed):
        with open_files_soft_limit(BROKER_START_OPEN_FILES):
            b = broker_factory()
        soft_in_broker, hard_in_broker = open_files_limits(b.proc.pid)
        assert soft_in_broker == (1 << 20 if hard_in_broker == "unlimited" else hard_in_broker)  # cli.py's target
        with open(b.log_path) as f:
            assert f"open files limit raised from {BROKER_START_OPEN_FILES} to {soft_in_broker}" in f.read()
        with stored_data_survives(b):
            idle = []
            try:
                for _ in range(IDLE_CONNECTIONS):
                    idle.append(connect(b))
                reports = ck_produce(b.bootstrap, "busy", [(None, b"v%d" % i, [], 1_700_000_000_000)
                                                           for i in range(20)])
                assert all(err is None for err, *_ in reports)
                assert len(kp_consume_all(b.bootstrap, "busy", 20)) == 20
                assert api_versions_on_every_socket(idle) == IDLE_CONNECTIONS
            finally:
                for sock in idle:
                    sock.close()


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
    assert still_serves(broker)
    assert len(kp_consume_all(broker.bootstrap, "slow", 30)) == 30
    sock.close()


def broker_log(b) -> str:
    with open(b.log_path, errors="replace") as f:
        return f.read()


def wait_for_log(b, pattern, timeout=LIVENESS_S) -> re.Match:
    """The first match of `pattern` in the broker's log, polled until it appears (bounded)."""
    return wait_for(lambda: re.search(pattern, broker_log(b)), f"{pattern!r} in the broker log", timeout)


def test_a_request_body_that_stalls_or_trickles_closes_only_that_connection(broker_factory):
    """Once a request's size is read its body must arrive within socket.request.read.timeout.ms; a client that
    stops, or sends a byte now and then, loses its connection (with a log line) and nobody else is affected."""
    b = broker_factory({"socket.request.read.timeout.ms": "1000"})
    with stored_data_survives(b):
        bystander = connect(b)  # idle between requests for as long as the others take: no body timeout applies
        stalled = connect(b)
        stalled.sendall(struct.pack(">i", 100) + b"\x00\x12")  # a size and 2 of its 100 bytes, then nothing
        stalled_large = connect(b)  # a body read into a buffer of its own (over 16 KB), 20 KB of 100 KB sent
        stalled_large.sendall(struct.pack(">i", 100_000) + b"\x00\x00" + bytes(20_000))
        trickling = connect(b)
        trickling.sendall(struct.pack(">i", 1000))
        sent = 0
        while sent < 1000 and not is_closed(trickling, wait=0.1):  # the whole body would take 100 s at this pace
            try:
                trickling.sendall(b"\x00")
            except OSError:
                break
            sent += 1
        assert sent < 1000, "the broker read a whole body sent a byte every 0.1 s, 100 times its read timeout"
        assert is_closed(stalled, wait=LIVENESS_S) and is_closed(stalled_large, wait=LIVENESS_S)
        assert len(re.findall(r"request body of (100|1000|100000) bytes not received within 1s", broker_log(b))) == 3
        assert api_versions_on_every_socket([bystander]) == 1
        assert still_serves(b)


def test_requests_split_at_any_byte_large_and_small_are_each_answered_once_in_order(broker):
    """Frames over 16 KB are read into a buffer of their own (the produce request's bytes, validated and written
    without a copy): produce and other requests, large and small, sent back to back and cut into pieces at every
    kind of boundary, are each answered once, in order, and stored as sent."""
    values = [bytes([i]) * size for i, size in enumerate([100_000, 10, 40_000, 16_380, 70_000])]
    with RawKafka(broker.port, timeout=LIVENESS_S) as client:
        client.create_topic("split")
        frames = [frame_of(produce_request("split", [(0, plain_batch([value]))]), correlation_id=100 + i)
                  for i, value in enumerate(values)]
        frames.insert(2, frame_of(MetadataRequest[4](topics=[MetadataRequest.MetadataRequestTopic(name="x" * 200)]
                                                     * 120, allow_auto_topic_creation=False), correlation_id=99))
        stream = b"".join(frames)
        cuts = sorted({1, 3, 4, 5, 17, 4096, 16_384, 16_389, 100_003, 100_004, 100_050, len(stream) - 1} |
                      {len(b"".join(frames[:i])) + d for i in range(1, len(frames)) for d in (-1, 0, 1, 6)})
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)]) if a < b]
        for piece in pieces:
            client.send_frame(piece)
            time.sleep(0.002)  # each piece read on its own, mostly
        for i in range(len(values)):
            if i == 2:
                client.receive(99, MetadataResponse, 4)
            assert client.receive_produce(100 + i).base_offset == i
    assert [r.value for r in read_topic(broker.port, "split", [0])] == values


PAUSE_LOG = r"connection (\d+) from [\d.:]+: reading paused while \d+ bytes of requests are unanswered \({}=\d+\)"


def test_pipelined_large_requests_pause_reading_and_are_all_answered_in_order(broker_factory):
    """Backpressure by bytes: once a connection's unanswered requests hold max.in.flight.bytes.per.connection,
    the broker stops reading it (its TCP window closes) until they are answered; nothing is dropped or reordered
    and other clients are served meanwhile. A long-poll fetch padded past the limit holds it deterministically
    until the test produces to the fetched partition; 40 produces of 300 KB are pipelined behind it."""
    limit = 1 << 20
    b = broker_factory({"max.in.flight.bytes.per.connection": str(limit),
                        "max.in.flight.requests.per.connection": "100"})
    batches = [plain_batch([bytes([i]) * 100_000] * 3) for i in range(40)]
    with stored_data_survives(b), RawKafka(b.port, timeout=LIVENESS_S) as pipelining:
        pipelining.create_topic("bulk")
        pipelining.create_topic("gate")
        padding = ["f%05d" % i + "x" * 32_000 for i in range(40)]  # ~1.3 MB of forgotten topics, ignored
        sent = []

        def pipeline():
            sent.append(pipelining.send(fetch_request([("gate", 0, 0)], max_wait_ms=300_000, min_bytes=1,
                                                      forgotten=padding)))
            sent.extend(pipelining.send_produce("bulk", 0, batch) for batch in batches)
        sender = threading.Thread(target=pipeline, daemon=True)
        sender.start()
        wait_for_log(b, PAUSE_LOG.format("max.in.flight.bytes.per.connection"))
        assert still_serves(b)  # another client, while that connection is not read
        with RawKafka(b.port) as other:
            # answers the parked fetch
            assert other.produce("gate", 0, plain_batch([b"open"])).error_code == ErrorCode.NONE
        sender.join(LIVENESS_S)
        assert not sender.is_alive() and len(sent) == 41
        assert fetch_answers(pipelining, sent[0]) == {("gate", 0): (ErrorCode.NONE, [b"open"])}
        answers = [pipelining.receive_produce(cid) for cid in sent[1:]]  # receive checks the order
        assert [(a.error_code, a.base_offset) for a in answers] == [(ErrorCode.NONE, 3 * i) for i in range(40)]
    stored = read_topic(b.port, "bulk", [0])
    assert [(r.offset, r.value) for r in stored] == [(3 * i + j, bytes([i]) * 100_000)
                                                    for i in range(40) for j in range(3)]


def test_the_broker_wide_request_bytes_bound_pauses_other_connections_until_answered(broker_factory):
    """queued.max.request.bytes bounds unanswered request bytes over all connections: while one connection's
    half-sent 100 KB request holds more than the 64 KB bound, the broker reads no other request; once that request
    is complete and answered, the waiting one is read, so its batch lands after the first."""
    b = broker_factory({"queued.max.request.bytes": str(64 * 1024), "socket.request.read.timeout.ms": "600000"})
    with stored_data_survives(b), RawKafka(b.port, timeout=LIVENESS_S) as second:
        second.create_topic("shared")
        first = connect(b)
        first.settimeout(LIVENESS_S)
        frame = frame_of(produce_request("shared", [(0, plain_batch([b"1" * 100_000]))]))
        first.sendall(frame[:len(frame) // 2])
        # Let the broker read the first request's size (it then counts all of it) before the second arrives: on a
        # loaded machine the second could otherwise be read first, and nothing would wait. (No request can serve as
        # the barrier: once the first is counted, the broker reads none.)
        time.sleep(1.0)
        waiting = second.send_produce("shared", 0, plain_batch([b"2"]))
        wait_for_log(b, PAUSE_LOG.format("queued.max.request.bytes"))
        first.sendall(frame[len(frame) // 2:])
        answer = ProduceResponse.decode(read_frame(first), version=9, header=True).responses[0].partition_responses[0]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
        assert second.receive_produce(waiting).base_offset == 1
        first.close()
    assert [r.value for r in read_topic(b.port, "shared", [0])] == [b"1" * 100_000, b"2"]
