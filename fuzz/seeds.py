"""Starting inputs for each target: well-formed messages as real clients send them, which the fuzzer then mutates
(it reaches the deep checks from these far sooner than from random bytes)."""
import base64
import json
from functools import cache

import scramp
from kafka.protocol.producer import ProduceRequest

from fuzz import oracles, targets
from protocol.api import REQUEST_CLASSES
from protocol.compression import CODEC_NAMES, compress
from protocol.records import Record, build_batch, build_control_batch
from protocol.sequence_headers import PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER

_TIME = 1_700_000_000_000
TOPIC = "fuzz"  # the broker target's topic (fuzz/broker.py): the seeds' requests name it


def _records(count: int = 3, headers: tuple = ()) -> list[Record]:
    return [Record(i, _TIME + i, f"key-{i}".encode(), f"value {i} ".encode() * 4, headers) for i in range(count)]


def batches() -> list[bytes]:
    sequenced = ((PRODUCER_NAME_HEADER, b"loader-1"), (SEQUENCE_ID_HEADER, b"42"))
    out = [build_batch(_records(), compression=codec) for codec in sorted(CODEC_NAMES)]
    out += [
        build_batch(_records(1, (("h", b"v"), ("n", None)))),
        build_batch(_records(2, sequenced)),
        build_batch(_records(2), producer_id=7, producer_epoch=0, base_sequence=0),
        build_batch(_records(2), producer_id=7, producer_epoch=0, base_sequence=2, transactional=True),
        build_batch(_records(2), max_timestamp=0),  # librdkafka's false maxTimestamp, fixed up by the broker
        build_batch([Record(0, _TIME, None, None)]),
        build_control_batch(base_offset=0, producer_id=7, producer_epoch=0, commit=True, coordinator_epoch=0,
                            timestamp_ms=_TIME),
    ]
    return out


def request_frames() -> list[bytes]:
    """Every API and version kop serves, with default values, and a Produce that carries a batch."""
    frames = []
    for api_key, (low, high) in sorted(oracles.SERVED.items()):
        for version in range(low, high + 1):
            frames.append(_frame(REQUEST_CLASSES[api_key][version]()))
    for version in (3, 9, 11):
        frames.append(_frame(ProduceRequest[version](transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
            ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batches()[0])])])))
    return frames


def _frame(request) -> bytes:
    request.with_header(correlation_id=1, client_id="fuzz")
    return bytes(request.encode(header=True, framed=False))


@cache
def scram_messages(mechanism: str) -> tuple[bytes, bytes]:
    """A real client's two messages, against the store's user (on replay the server's nonce differs: the fuzzer
    still starts from well-formed messages)."""
    client = scramp.ScramClient([mechanism], oracles.USER, oracles.PASSWORD)
    credential = oracles._users().credential(oracles.USER, mechanism)
    server = scramp.ScramMechanism(mechanism).make_server(
        lambda _user: (credential.salt, credential.stored_key, credential.server_key, credential.iterations))
    first = client.get_client_first()
    server.set_client_first(first)
    client.set_server_first(server.get_server_first())
    return first.encode(), client.get_client_final().encode()


def sasl() -> list[bytes]:
    out = [b"\x00" + b"\x00" + oracles.USER.encode() + b"\x00" + oracles.PASSWORD.encode(),
           b"\x00" + b"alice\x00alice\x00wrong"]
    for selector, mechanism in ((1, "SCRAM-SHA-256"), (3, "SCRAM-SHA-512")):
        out.append(bytes([selector]) + targets.join_two(*scram_messages(mechanism)))
    return out


def unsecured_jwt(claims: dict) -> str:
    def part(value: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none'})}.{part(claims)}."


def oauthbearer() -> list[bytes]:
    now = oracles.NOW_MS / 1000
    tokens = [unsecured_jwt({"sub": "alice", "exp": now + 3600, "iat": now}),
              unsecured_jwt({"sub": "alice", "exp": now - 60}),
              unsecured_jwt({"sub": "alice", "exp": now + 60, "scope": ["kafka", "other"]})]
    out = []
    for selector, token in enumerate(tokens):
        message = f"n,a=alice,\x01auth=Bearer {token}\x01host=kop\x01\x01".encode()
        out.append(bytes([selector % 2]) + targets.join_two(message, b"\x01"))
    return out


def admin_auth() -> list[bytes]:
    return [b"\x00" + oracles.basic_credentials(oracles.USER.encode(), oracles.PASSWORD.encode()).encode(),
            b"\x01" + oracles.basic_credentials(b"bob", b"nope").encode(),
            b"\x01Bearer admin-token", b"\x00Bearer not-it", b"\x00Digest x"]


def codec() -> list[bytes]:
    plain = b"kop fuzz " * 50
    return [bytes([targets.CODECS.index(codec)]) + compress(codec, plain) for codec in targets.CODECS]


SEEDS = {
    "request": request_frames,
    "broker": request_frames,
    "records": lambda: [b"\x03" + batch for batch in batches()],
    "codec": codec,
    "sasl": sasl,
    "oauthbearer": oauthbearer,
    "admin-auth": admin_auth,
}
