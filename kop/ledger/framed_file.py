"""Length- and CRC-framed records in an append-only file: the on-disk unit of ledgers and cursor logs.

A record is `[u32 length][u32 crc32c(payload)][payload]`. A crash can leave a torn tail (a partial record); readers
find it by length and CRC and the owner truncates it, so a record is either wholly present or absent.
"""
import contextlib
import errno
import os
import struct
from collections.abc import Iterator

import crc32c

RECORD_HEADER = struct.Struct(">II")
HEADER_SIZE = RECORD_HEADER.size


def frame(payload: bytes) -> bytes:
    return RECORD_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload


def frame_parts(head: bytes, body: bytes | bytearray | memoryview) -> tuple[bytes, bytes | bytearray | memoryview]:
    """The record of payload head + body, as two parts to write one after the other (pwritev, append_at): the body,
    however large, is neither copied nor concatenated, and the CRC runs over it once."""
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return RECORD_HEADER.pack(len(head) + len(body), crc) + head, body


def unframe(record: bytes) -> memoryview | None:
    """The payload of one whole framed record held in memory, or None if its length or CRC does not match."""
    if len(record) < HEADER_SIZE:
        return None
    length, crc = RECORD_HEADER.unpack_from(record, 0)
    payload = memoryview(record)[HEADER_SIZE:]
    if len(payload) != length or crc32c.crc32c(payload) != crc:
        return None
    return payload


def read_record(fd: int, pos: int, file_size: int, max_record: int) -> bytes | None:
    """The payload of the record at pos, or None if it is torn, oversized or fails its CRC."""
    if pos + HEADER_SIZE > file_size:
        return None
    length, crc = RECORD_HEADER.unpack(os.pread(fd, HEADER_SIZE, pos))
    if length > max_record or pos + HEADER_SIZE + length > file_size:
        return None
    payload = os.pread(fd, length, pos + HEADER_SIZE)
    if len(payload) != length or crc32c.crc32c(payload) != crc:
        return None
    return payload


def scan_records(fd: int, start: int, file_size: int, max_record: int) -> Iterator[tuple[int, bytes]]:
    """(position, payload) of each valid record from start until the first invalid one (the torn tail)."""
    pos = start
    while True:
        payload = read_record(fd, pos, file_size, max_record)
        if payload is None:
            return
        yield pos, payload
        pos += HEADER_SIZE + len(payload)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_all_at(fd: int, data: bytes | memoryview, pos: int) -> None:
    """pwrite all of data at pos (the file offset does not move)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, pos)
        view, pos = view[written:], pos + written


def _write_parts_at(fd: int, parts: tuple, pos: int) -> None:
    written = os.pwritev(fd, parts, pos)
    if written < len(parts[0]) + len(parts[1]):  # a short write (a nearly full disk): the rest, as one buffer
        write_all_at(fd, b"".join(parts)[written:], pos + written)


def append_at(fd: int, data: bytes | memoryview | tuple, pos: int, torn_at: int | None = None) -> None:
    """Write all of data (bytes, or frame_parts' two parts, written one after the other) at pos, the end of the file's
    valid records; when that fails (a full disk can take part of it), cut the file back to pos, so no half-written
    record is left behind the valid ones. `torn_at` (a failpoint): write only that many bytes, then fail with EIO,
    as a disk error part-way through the write would."""
    try:
        if torn_at is not None:
            write_all_at(fd, (b"".join(data) if isinstance(data, tuple) else bytes(data))[:torn_at], pos)
            raise OSError(errno.EIO, "injected write failure (a torn write)")
        if isinstance(data, tuple):
            _write_parts_at(fd, data, pos)
        else:
            write_all_at(fd, data, pos)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, pos)
        raise


def write_synced(path: str, data: bytes, flags: int, durable: bool, mode: int = 0o644) -> None:
    """Open path with flags (a new file gets `mode`), write all of data, and fsync it when durable."""
    fd = os.open(path, flags, mode)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: str, data: bytes, durable: bool = True, mode: int = 0o644) -> None:
    """Write data to path so that readers see either the old or the new content, never a mix."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover keeps its mode: the new file must get `mode`
    write_synced(tmp, data, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, durable, mode)
    os.replace(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: str, durable: bool = True) -> None:
    """os.makedirs, then fsync the parent of each directory it created, so that new directories (and so the files
    that will be created in them) survive a power loss."""
    created = []
    missing = os.path.abspath(path)
    while not os.path.isdir(missing):
        created.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(path, exist_ok=True)
    if durable:
        for directory in created:
            fsync_dir(os.path.dirname(directory))
