"""The fuzz targets: each takes one input of bytes, lays it out for its oracle and calls it. The layouts are plain
(a selector byte, a 2-byte length before a first message) so seeds are easy to write and a saved input is easy to
read. Nothing here imports atheris: tests/test_fuzz_regressions.py replays saved inputs through the same functions.
"""
import hashlib
import os
import struct
from collections.abc import Callable
from pathlib import Path

import crc32c

from fuzz import oracles
from protocol.compression import GZIP, LZ4, SNAPPY, ZSTD
from protocol.records import CRC_OFFSET, CRC_START

KEEP_DIRECTORY = "KOP_FUZZ_KEEP"  # where a target keeps an input that broke its oracle itself (fuzz/__main__.py)
BATCH_LENGTH_END = 12  # baseOffset int64, batchLength int32: the length counts the bytes after it

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
    """Selector byte: bit 1 sets the batch length to the bytes that follow it, bit 0 then fixes the CRC, so the
    mutations reach the checks behind them (a random change almost never keeps a CRC32C right)."""
    if not data:
        return
    batch = bytearray(data[1:])
    if data[0] & 2 and len(batch) >= BATCH_LENGTH_END:
        struct.pack_into(">i", batch, BATCH_LENGTH_END - 4, len(batch) - BATCH_LENGTH_END)
    if data[0] & 1 and len(batch) >= CRC_START:
        struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(bytes(batch[CRC_START:])))
    oracles.produce_records(bytes(batch))


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


def broker(data: bytes) -> None:
    from fuzz.broker import InternalError, request_to_broker  # starts a broker in this process on first use

    try:
        request_to_broker(data)
    except InternalError:
        # libFuzzer saves a crashing input at exit, which the broker's threads can outlast (the run then ends by
        # its alarm, with nothing saved): the runner's directory gets it first
        keep = os.environ.get(KEEP_DIRECTORY)
        if keep:
            Path(keep, f"crash-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
        raise


TARGETS: dict[str, Callable[[bytes], None]] = {
    "request": request,
    "broker": broker,
    "records": records,
    "codec": codec,
    "sasl": sasl,
    "oauthbearer": oauthbearer,
    "admin-auth": admin_auth,
}
