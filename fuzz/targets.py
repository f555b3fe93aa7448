"""The fuzz targets: each takes one input of bytes, lays it out for its oracle and calls it. The layouts are plain
(a selector byte, a 2-byte length before a first message) so seeds are easy to write and a saved input is easy to
read. Nothing here imports atheris: tests/test_fuzz_regressions.py replays saved inputs through the same functions.
"""
from collections.abc import Callable

from fuzz import oracles
from protocol.compression import GZIP, LZ4, SNAPPY, ZSTD

CODECS = (GZIP, SNAPPY, LZ4, ZSTD)
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ADMIN_METHODS = ("GET", "POST")


def split_two(data: bytes) -> tuple[bytes, bytes]:
    """A first message (its length in 2 big-endian bytes, then its bytes) and a second (the rest)."""
    size = int.from_bytes(data[:2], "big")
    return data[2:2 + size], data[2 + size:]


def join_two(first: bytes, second: bytes) -> bytes:
    return len(first).to_bytes(2, "big") + first + second


def request(data: bytes) -> None:
    oracles.request_frame(data)


def records(data: bytes) -> None:
    oracles.produce_records(data)


def codec(data: bytes) -> None:
    if data:
        oracles.codec_stream(CODECS[data[0] % len(CODECS)], data[1:])


def sasl(data: bytes) -> None:
    """Selector byte: even PLAIN (the rest is its token), odd SCRAM (bit 1 picks the hash; two messages)."""
    if not data:
        return
    if data[0] % 2 == 0:
        oracles.sasl_plain(data[1:])
    else:
        oracles.scram(SCRAM_MECHANISMS[(data[0] >> 1) % 2], *split_two(data[1:]))


def oauthbearer(data: bytes) -> None:
    """Selector byte: odd requires the scope `kafka`; then the client message and its acknowledgement."""
    if data:
        oracles.oauthbearer(*split_two(data[1:]), required_scope="kafka" if data[0] % 2 else "")


def admin_auth(data: bytes) -> None:
    """Selector byte: the method (a read or a change); the rest is the Authorization header as HTTP carries it."""
    if data:
        oracles.admin_authorization(ADMIN_METHODS[data[0] % 2], data[1:].decode("latin-1"))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "request": request,
    "records": records,
    "codec": codec,
    "sasl": sasl,
    "oauthbearer": oauthbearer,
    "admin-auth": admin_auth,
}
