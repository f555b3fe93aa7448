"""One ledger of a managed ledger: an append-only file of entries plus an index of their first Kafka offsets.

Entry payload (inside a framed record, see framed_file):
`[i64 first_index][i32 span][u16 metadata length][metadata][data]`, covering offsets [first_index, first_index + span),
where metadata is a serialized MessageMetadata and data the Kafka record batch with its offsets assigned.
The index file `{id}.idx` holds `[i64 first_index][i64 file position]` per entry. It is written after the entries it
describes are durable and is not itself fsynced: on open it is checked against the log and the log's tail is scanned,
so a short or stale index is repaired, never trusted blindly.
Each ledger also keeps its batches' max timestamps in memory (see time_index) for ListOffsets by time.
Both files are opened through the broker's file pool (see file_pool), so an idle ledger holds no descriptor.
"""
import os
import struct
import sys
from array import array
from bisect import bisect_right
from dataclasses import dataclass

from kop.ledger.file_pool import FilePool, PooledFile
from kop.ledger.framed_file import (HEADER_SIZE, RECORD_HEADER, append_at, frame, frame_parts, read_record,
                                    scan_records)
from kop.ledger.time_index import TIMESTAMP_END, TimeIndex, batch_max_timestamp

ENTRY_HEADER = struct.Struct(">qiH")
INDEX_RECORD = struct.Struct(">qq")
# Index records are written once this many durable entries lack them (and when the ledger rolls or closes), not one
# write per flush: an index shorter than its log is repaired by scanning the log's tail on open.
INDEX_EVERY = 64


@dataclass(slots=True)
class RawEntry:
    entry_id: int
    first_index: int
    span: int
    metadata: bytes
    data: memoryview


def encode_entry(first_index: int, span: int, metadata: bytes, data: bytes | memoryview) -> bytes:
    return frame(ENTRY_HEADER.pack(first_index, span, len(metadata)) + metadata + bytes(data))


def entry_parts(first_index: int, span: int, metadata: bytes,
                data: bytes | bytearray | memoryview) -> tuple[bytes, bytes | bytearray | memoryview]:
    """encode_entry's bytes as two parts, the batch not copied (what an append writes)."""
    return frame_parts(ENTRY_HEADER.pack(first_index, span, len(metadata)) + metadata, data)


def decode_entry(entry_id: int, payload: bytes | memoryview) -> RawEntry:
    first_index, span, meta_len = ENTRY_HEADER.unpack_from(payload, 0)
    start = ENTRY_HEADER.size
    view = memoryview(payload)
    return RawEntry(entry_id, first_index, span, bytes(view[start:start + meta_len]), view[start + meta_len:])


class LedgerFile:
    def __init__(self, ledger_id: int, log: PooledFile, idx: PooledFile) -> None:
        self.ledger_id = ledger_id
        self.log = log
        self.idx = idx
        self.log_path = log.path
        self.idx_path = idx.path
        self.first_indexes = array("q")
        self.file_positions = array("q")
        self.size = 0  # bytes written to the log (durable or not)
        self.indexed = 0  # entries whose index record has been written
        self.durable = 0  # entries known to be durable (all of a ledger written before this process)
        self.closed = False
        # Batch timestamps: kept from the first append for a new ledger, built on first use for a recovered one,
        # whose greatest timestamp ledgers.info may record (so a search can skip it without reading it).
        self.times: TimeIndex | None = None
        self.recorded_max_timestamp: int | None = None

    @classmethod
    def create(cls, pool: FilePool, directory: str, ledger_id: int) -> "LedgerFile":
        log = pool.create(os.path.join(directory, f"{ledger_id}.log"))
        try:
            idx = pool.create(os.path.join(directory, f"{ledger_id}.idx"))
        except OSError:
            log.close()
            raise
        ledger = cls(ledger_id, log, idx)
        ledger.times = TimeIndex()
        return ledger

    @classmethod
    def open_existing(cls, pool: FilePool, directory: str, ledger_id: int, max_entry_bytes: int) -> "LedgerFile":
        """Open a ledger written before, repair its index, and truncate a torn tail."""
        log = pool.file(os.path.join(directory, f"{ledger_id}.log"))
        idx = pool.file(os.path.join(directory, f"{ledger_id}.idx"), os.O_RDWR | os.O_CREAT)
        ledger = cls(ledger_id, log, idx)
        try:
            ledger._recover(max_entry_bytes)
        except OSError:
            ledger.close()
            raise
        return ledger

    def _recover(self, max_entry_bytes: int) -> None:
        fd = self.log.pin()  # both in use at once: neither may be closed to make room for the other
        try:
            idx_fd = self.idx.pin()
            try:
                self._recover_with(fd, idx_fd, max_entry_bytes)
            finally:
                self.idx.unpin()
        finally:
            self.log.unpin()

    def _recover_with(self, fd: int, idx_fd: int, max_entry_bytes: int) -> None:
        log_size = os.fstat(fd).st_size
        raw = os.pread(idx_fd, os.fstat(idx_fd).st_size, 0)
        count = len(raw) // INDEX_RECORD.size
        pairs = array("q")
        pairs.frombytes(raw[: count * INDEX_RECORD.size])
        if sys.byteorder == "little":
            pairs.byteswap()
        # Trust the index up to the last record that points at a valid entry with the same first index.
        while count > 0:
            first, pos = pairs[2 * count - 2], pairs[2 * count - 1]
            payload = read_record(fd, pos, log_size, max_entry_bytes)
            if payload is not None and ENTRY_HEADER.unpack_from(payload, 0)[0] == first:
                break
            count -= 1
        self.first_indexes = pairs[0 : 2 * count : 2]
        self.file_positions = pairs[1 : 2 * count : 2]
        resume = 0
        if count:
            last = read_record(fd, self.file_positions[-1], log_size, max_entry_bytes)
            resume = self.file_positions[-1] + HEADER_SIZE + len(last)
        end = resume
        for pos, payload in scan_records(fd, resume, log_size, max_entry_bytes):
            self.first_indexes.append(ENTRY_HEADER.unpack_from(payload, 0)[0])
            self.file_positions.append(pos)
            end = pos + HEADER_SIZE + len(payload)
        if end < log_size:
            os.ftruncate(fd, end)  # the torn tail of a crash: never acknowledged
        self.size = end
        # Keep the index records that were right; drop stale ones and add those the scan found.
        os.ftruncate(idx_fd, count * INDEX_RECORD.size)
        self.indexed = count
        self.durable = len(self.first_indexes)
        self.write_index(self.durable)

    @classmethod
    def rewritten(cls, pool: FilePool, old: "LedgerFile", positions: tuple[int, ...], size: int) -> "LedgerFile":
        """The closed ledger `old` once compaction rewrote its files in place: the same entries (ids, offsets,
        batch timestamps) at new positions."""
        ledger = cls(old.ledger_id, pool.file(old.log_path), pool.file(old.idx_path))
        ledger.first_indexes = array("q", old.first_indexes)
        ledger.file_positions = array("q", positions)
        ledger.size = size
        ledger.indexed = ledger.durable = len(positions)
        ledger.closed = True
        ledger.times, ledger.recorded_max_timestamp = old.times, old.recorded_max_timestamp
        return ledger

    @property
    def entries(self) -> int:
        return len(self.first_indexes)

    def append(self, first_index: int, span: int, metadata: bytes, data: bytes | memoryview,
               torn: bool = False) -> int:
        """Write one entry to the page cache; returns its entry id. Durability is the caller's fsync, through a
        descriptor it pins right after (`log.pin()`), before anything else can use the pool. `torn` (a failpoint):
        write half the record, then fail with EIO."""
        parts = entry_parts(first_index, span, metadata, data)
        pos = self.size
        append_at(self.log.fd(), parts, pos, (len(parts[0]) + len(parts[1])) // 2 if torn else None)
        self.size += len(parts[0]) + len(parts[1])
        self.first_indexes.append(first_index)
        self.file_positions.append(pos)
        if self.times is not None:
            self.times.append(batch_max_timestamp(data))
        return len(self.first_indexes) - 1

    def write_index(self, upto: int, at_once: bool = True) -> None:
        """Write index records for entries [indexed, upto): they are durable now. at_once=False leaves them for
        later unless INDEX_EVERY are waiting."""
        if upto <= self.indexed or (not at_once and upto - self.indexed < INDEX_EVERY):
            return
        chunk = b"".join(
            INDEX_RECORD.pack(self.first_indexes[i], self.file_positions[i]) for i in range(self.indexed, upto)
        )
        os.pwrite(self.idx.fd(), chunk, self.indexed * INDEX_RECORD.size)
        self.indexed = upto

    def truncate(self, entries: int) -> None:
        """Drop entries [entries, ...): they were never durable. They leave memory first: should the files not be cut
        (an I/O error, raised), the entries are still out of what is served and of the count ledgers.info records
        when the ledger closes, and opening it drops them."""
        if entries >= len(self.first_indexes):
            return
        self.size = self.file_positions[entries]
        del self.first_indexes[entries:]
        del self.file_positions[entries:]
        self.durable = min(self.durable, entries)
        if self.times is not None:
            self.times.truncate(entries)
        indexed, self.indexed = self.indexed, min(self.indexed, entries)
        os.ftruncate(self.log.fd(), self.size)
        if indexed > entries:
            os.ftruncate(self.idx.fd(), entries * INDEX_RECORD.size)

    def sync(self) -> None:
        os.fsync(self.log.fd())

    def find(self, index: int) -> int:
        """Entry id of the entry holding Kafka offset `index` (the last entry whose first index is <= it), or -1."""
        return bisect_right(self.first_indexes, index) - 1

    def max_timestamp(self) -> int | None:
        """The greatest batch max timestamp stored here, None when it is not known without reading the ledger."""
        if self.times is not None:
            return self.times.max_until(self.entries - 1)
        return self.recorded_max_timestamp

    def read_time_index(self, positions: array) -> TimeIndex:
        """Build the time index of the entries at `positions` from their batch headers (blocking: run it in a
        thread). Reads through a descriptor of its own, so a concurrent delete of the ledger cannot pull the file
        away under it."""
        times = TimeIndex()
        fd = os.open(self.log_path, os.O_RDONLY)
        try:
            for pos in positions:
                head = os.pread(fd, HEADER_SIZE + ENTRY_HEADER.size, pos)
                length = RECORD_HEADER.unpack_from(head, 0)[0]
                meta_len = ENTRY_HEADER.unpack_from(head, HEADER_SIZE)[2]
                data_len = length - ENTRY_HEADER.size - meta_len
                data_at = pos + HEADER_SIZE + ENTRY_HEADER.size + meta_len
                times.append(batch_max_timestamp(os.pread(fd, min(TIMESTAMP_END, data_len), data_at)))
        finally:
            os.close(fd)
        return times

    def read(self, first_entry: int, last_entry: int, max_bytes: int, at_least_one: bool = True) -> list[RawEntry]:
        """Entries first..last (inclusive), stopping once max_bytes is reached; at least one entry is returned
        unless `at_least_one` is false (only the first entry of a response may exceed the limit, as in KIP-74)."""
        start = self.file_positions[first_entry]
        end_of = (lambda e: self.file_positions[e + 1] if e + 1 < len(self.file_positions) else self.size)
        if not at_least_one and end_of(first_entry) - start > max_bytes:
            return []
        last = first_entry
        while last < last_entry and end_of(last + 1) - start <= max_bytes:
            last += 1
        buf = memoryview(os.pread(self.log.fd(), end_of(last) - start, start))
        out = []
        offset = 0
        for entry_id in range(first_entry, last + 1):
            length, _crc = RECORD_HEADER.unpack_from(buf, offset)
            payload = buf[offset + HEADER_SIZE: offset + HEADER_SIZE + length]
            out.append(decode_entry(entry_id, payload))
            offset += HEADER_SIZE + length
        return out

    def close(self) -> None:
        self.log.close()
        self.idx.close()

    def delete_files(self) -> None:
        self.close()
        for path in (self.log_path, self.idx_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


__all__ = ["LedgerFile", "RawEntry", "encode_entry", "decode_entry"]
