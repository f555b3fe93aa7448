"""Capture record batches written by librdkafka (confluent-kafka) and the Java client (kafka-clients 3.9.1).

These clients need a broker to send to, so this script starts `kop standalone` in a temporary directory, produces
with each client and each compression setting to a fresh topic, then reads the stored batches back with a raw
Fetch (v4) and saves them as `<client>_<codec>.bin`. kop stores a client's batch byte for byte; only baseOffset
and partitionLeaderEpoch (both outside the CRC) are the broker's, and on a fresh topic baseOffset is 0 anyway.
The records that went in are described under "librdkafka" and "java" in golden.json.

(librdkafka sends lz4 batches uncompressed to a broker that does not advertise FindCoordinator: its LZ4 feature
depends on that API. kop serves it, so librdkafka_lz4.bin is a real lz4 batch.)

Run from the repository root, after `make java`:  .venv/bin/python tests/data/capture_via_kop.py [NAME ...]
where the optional names (e.g. librdkafka_lz4) limit the capture to those files.
"""
import json
import pathlib
import socket
import struct
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

from kafka.protocol.consumer import FetchRequest, FetchResponse  # noqa: E402

from integration.broker_process import BrokerProcess  # noqa: E402
from integration.java_client import java_produce  # noqa: E402
from protocol.errors import ErrorCode  # noqa: E402
from make_golden import CODECS, RECORDS  # noqa: E402

HERE = pathlib.Path(__file__).parent
# The Java harness makes record i from these: key f"key-{i}", value f"{prefix}{i}", header seq=f"{i}".
JAVA_COUNT = 5
JAVA_VALUE_PREFIX = "java value, compressible " * 8


def produce_librdkafka(bootstrap: str, topic: str, codec: str) -> None:
    from confluent_kafka import Producer
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 200,
                         "enable.idempotence": True})
    for _, timestamp, key, value, headers in RECORDS:
        producer.produce(topic, key=key, value=value, headers=headers or None, timestamp=timestamp, partition=0,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(60) == 0 and not errors, errors


def produce_java(bootstrap: str, topic: str, codec: str) -> None:
    deliveries = java_produce(bootstrap, topic, JAVA_COUNT, compression=codec, linger_ms=200, key_prefix="key-",
                              value_prefix=JAVA_VALUE_PREFIX, headers={"seq": "{i}"}, partition=0)
    assert all(d.ok for d in deliveries), deliveries


def fetch_raw(port: int, topic: str) -> bytes:
    request = FetchRequest[4](
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 24, isolation_level=0,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 24)])])
    request.with_header(correlation_id=1, client_id="golden-capture")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        size = struct.unpack(">i", _recv(sock, 4))[0]
        response = FetchResponse.decode(_recv(sock, size), version=4, header=True)
    [topic_response] = response.responses
    [partition] = topic_response.partitions
    assert partition.error_code == ErrorCode.NONE, partition
    return bytes(partition.records)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def main(only: list[str]) -> None:
    producers = {"librdkafka": produce_librdkafka, "java": produce_java}
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(str(pathlib.Path(tmp) / "data")).start()
        try:
            for client, produce in producers.items():
                for name in CODECS.values():
                    if only and f"{client}_{name}" not in only:
                        continue
                    topic = f"golden-{client}-{name}"
                    produce(broker.bootstrap, topic, name)
                    (HERE / f"{client}_{name}.bin").write_bytes(fetch_raw(broker.port, topic))
        finally:
            broker.stop()
    golden_path = HERE / "golden.json"
    golden = json.loads(golden_path.read_text())
    golden["librdkafka"] = {"records": "the same records as kafka_python and aiokafka", "idempotent": True,
                            "codecs": list(CODECS.values())}
    golden["java"] = {
        "records": [{"key": f"key-{i}".encode().hex(), "value": f"{JAVA_VALUE_PREFIX}{i}".encode().hex(),
                     "headers": [["seq", str(i).encode().hex()]]} for i in range(JAVA_COUNT)],
        "idempotent": True,
        "timestamps": "the producer's clock at send time",
    }
    golden_path.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
