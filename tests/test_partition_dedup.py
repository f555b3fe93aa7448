"""A partition (kop/partition.py) over the real file ledger, where the dedup core meets storage: a write that fails
before it reaches the disk comes back through the ledger's failure path after the writes before it; a dedup recovery
that fails answers a retriable error until a retry succeeds; enabling dedup at run time covers the writes in flight.

Faults are injected where the disk would cause them: an append that raises OSError (ENOSPC), a flush held in its
worker thread (a stuck disk, the ledger's own test hook), a read error during the replay."""

from __future__ import annotations

import asyncio
import errno
import time

from dedup import DedupConfig, Status
from kop.ledger import LedgerConfig, FileManagedLedger, cursor_log
from kop.ledger.position import BEFORE_FIRST
from kop.ledger.ledger_file import LedgerFile
from kop.partition import PartitionLog
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, iter_records, split_batches

PID = 7
NAME = f"KOP-PID-{PID}-0"



def batch(seq: int, *values: bytes, pid: int = PID):
    """(header, view) of one idempotent batch, as the Produce handler hands it to the partition."""
    records = [Record(offset=i, timestamp=1_000 + i, key=None, value=v) for i, v in enumerate(values)]
    identity = {"producer_id": pid, "producer_epoch": 0, "base_sequence": seq} if pid >= 0 else {}
    [(header, view)] = split_batches(build_batch(records, **identity))
    return header, view


async def open_partition(directory, enabled: bool = True, **config) -> PartitionLog:
    ledger = FileManagedLedger.open("t-partition-0", str(directory), LedgerConfig(), None)
    partition = PartitionLog("t", 0, ledger, DedupConfig(**config))
    await partition.apply_dedup_policy(enabled)
    return partition


def stored(partition: PartitionLog) -> list[tuple[int, bytes]]:
    out = []
    for entry in partition.read(partition.log_start_offset, 1 << 30):
        for _header, view in split_batches(bytes(entry.data)):
            out += [(r.offset, r.value) for r in iter_records(view)]
    return out


def unreadable(self, position, max_entries):
    raise OSError(errno.EIO, "Input/output error")


def fail_appends(monkeypatch, count: int) -> None:
    """The next `count` appends fail before reaching the file, as on a full disk."""
    original = LedgerFile.append
    left = [count]

    def append(self, *args):
        if left[0]:
            left[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, *args)

    monkeypatch.setattr(LedgerFile, "append", append)


async def answers(*futures) -> list[tuple[ErrorCode, int]]:
    return [(r.error, r.base_offset) for r in await asyncio.gather(*futures)]


async def test_a_write_failing_before_the_disk_fails_after_the_writes_in_flight_land(tmp_path, monkeypatch):
    partition = await open_partition(tmp_path / "p")
    partition.ledger.hold_flushes(True)
    landing = [partition.publish_normal(*batch(seq, b"v%d" % seq)) for seq in (0, 1)]
    await asyncio.sleep(0)  # their flush is under way, held in its thread
    fail_appends(monkeypatch, 1)
    failing = [partition.publish_normal(*batch(seq, b"v%d" % seq)) for seq in (2, 3)]  # 3: pipelined behind 2
    partition.ledger.hold_flushes(False)
    assert await answers(*landing, *failing) == [
        (ErrorCode.NONE, 0), (ErrorCode.NONE, 1),
        (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1), (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)]
    # What the client was told is what the dedup state says: 0 and 1 stored, 2 and 3 to be resent.
    assert dict(partition.dedup.pushed) == dict(partition.dedup.persisted) == {NAME: 1}
    assert await answers(partition.publish_normal(*batch(1, b"v1"))) == [(ErrorCode.NONE, 1)]  # a lost response
    assert await answers(partition.publish_normal(*batch(3, b"v3"))) == [(ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)]
    assert await answers(*(partition.publish_normal(*batch(seq, b"v%d" % seq)) for seq in (2, 3))) == [
        (ErrorCode.NONE, 2), (ErrorCode.NONE, 3)]
    assert stored(partition) == [(i, b"v%d" % i) for i in range(4)]
    ledgers = partition.ledger.internal_stats().ledgers
    assert [l.entries for l in ledgers] == [2, 2], ledgers  # the failure rolled the ledger
    await partition.close()


async def test_a_failed_dedup_recovery_answers_retriable_errors_until_a_retry_recovers(tmp_path, monkeypatch):
    partition = await open_partition(tmp_path / "p")
    assert await answers(partition.publish_normal(*batch(0, b"a", b"b")),
                         partition.publish_normal(*batch(2, b"c"))) == [(ErrorCode.NONE, 0), (ErrorCode.NONE, 2)]
    await partition.close()

    original, failures = FileManagedLedger.read_after, [1]

    def read_after(self, position, max_entries, *limits):
        if failures[0]:
            failures[0] -= 1
            return unreadable(self, position, max_entries)
        return original(self, position, max_entries, *limits)

    monkeypatch.setattr(FileManagedLedger, "read_after", read_after)
    partition = await open_partition(tmp_path / "p", recovery_retry_seconds=0)
    assert partition.dedup.status is Status.FAILED
    # Retention keeps what the retry will replay, even past its limits (a restart rolled the ledger: one is closed).
    await partition.ledger.trim(int(time.time() * 1000) + 10**6, 0, 0, partition.retention_floor())
    assert partition.read(0, 1 << 20), "retention deleted the entries the dedup recovery has to replay"
    # The retry of a stored batch is neither accepted (it would be stored twice) nor answered as stored.
    assert await answers(partition.publish_normal(*batch(2, b"c"))) == [(ErrorCode.REQUEST_TIMED_OUT, -1)]
    # That produce started a new recovery; the client's next retry finds it done.
    for _ in range(100):
        if partition.dedup.status is Status.ENABLED:
            break
        await asyncio.sleep(0.01)
    assert partition.dedup.status is Status.ENABLED
    assert await answers(partition.publish_normal(*batch(2, b"c"))) == [(ErrorCode.NONE, 2)]
    assert await answers(partition.publish_normal(*batch(3, b"d"))) == [(ErrorCode.NONE, 3)]
    assert stored(partition) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    await partition.close()


async def test_enabling_dedup_at_run_time_covers_the_writes_in_flight(tmp_path):
    partition = await open_partition(tmp_path / "p", enabled=False)
    partition.ledger.hold_flushes(True)
    original = partition.publish_normal(*batch(0, b"a", b"b"))  # accepted while dedup is off, not yet durable
    await asyncio.sleep(0)
    enabling = asyncio.ensure_future(partition.apply_dedup_policy(True))
    await asyncio.sleep(0)
    assert partition.dedup.status is Status.RECOVERING
    # Its retry cannot be judged until the original has landed and been replayed.
    assert await answers(partition.publish_normal(*batch(0, b"a", b"b"))) == [(ErrorCode.REQUEST_TIMED_OUT, -1)]
    partition.ledger.hold_flushes(False)
    assert await answers(original) == [(ErrorCode.NONE, 0)]
    assert await enabling is Status.ENABLED
    assert await answers(partition.publish_normal(*batch(0, b"a", b"b"))) == [(ErrorCode.NONE, 0)]
    assert stored(partition) == [(0, b"a"), (1, b"b")]
    await partition.close()


async def test_batches_without_a_producer_id_are_taken_while_the_dedup_state_is_recovered(tmp_path, monkeypatch):
    monkeypatch.setattr(FileManagedLedger, "read_after", unreadable)
    partition = await open_partition(tmp_path / "p", recovery_retry_seconds=3600)
    assert partition.dedup.status is Status.FAILED
    assert await answers(partition.publish_normal(*batch(-1, b"x", pid=-1))) == [(ErrorCode.NONE, 0)]
    assert await answers(partition.publish_normal(*batch(0, b"y"))) == [(ErrorCode.REQUEST_TIMED_OUT, -1)]
    await partition.close()


async def test_a_dedup_cursor_whose_first_record_failed_is_written_by_the_retried_recovery(tmp_path, monkeypatch):
    """The retried recovery must not take the cursor left in memory for a stored one: after a crash before any
    snapshot it would not exist, come back at the end of the log, and skip the replay of what was taken meanwhile."""
    partition = await open_partition(tmp_path / "p", enabled=False, recovery_retry_seconds=0)
    assert await answers(partition.publish_normal(*batch(0, b"a"))) == [(ErrorCode.NONE, 0)]
    original, failures = cursor_log._pwrite_all, [1]

    def pwrite_all(fd, data, offset):
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(fd, data, offset)

    monkeypatch.setattr(cursor_log, "_pwrite_all", pwrite_all)
    assert await partition.apply_dedup_policy(True) is Status.FAILED  # the cursor's first record was not written
    assert await answers(partition.publish_normal(*batch(1, b"b"))) == [(ErrorCode.REQUEST_TIMED_OUT, -1)]
    assert await partition.apply_dedup_policy(True) is Status.ENABLED  # the retry
    assert await answers(partition.publish_normal(*batch(1, b"b"))) == [(ErrorCode.NONE, 1)]

    crashed = await open_partition(tmp_path / "p")  # kill -9: a new process on the same files, no snapshot taken
    assert await answers(crashed.publish_normal(*batch(1, b"b"))) == [(ErrorCode.NONE, 1)]  # the retry: stored once
    assert stored(crashed) == [(0, b"a"), (1, b"b")]
    await crashed.close()
    await partition.close()


async def test_a_replicator_holding_retention_back_keeps_its_entries_and_costs_no_dedup_snapshots(tmp_path):
    """A replicator's cursor behind the oldest ledger holds it back (a remote that is down); the dedup snapshot that
    retention asks for when the dedup cursor holds a ledger back would free nothing then, so none is taken."""
    partition = await open_partition(tmp_path / "p")
    await answers(partition.publish_normal(*batch(0, b"a")), partition.publish_normal(*batch(1, b"b")))
    replicator = partition.ledger.open_cursor("pulsar.repl.west", BEFORE_FIRST)
    await replicator.mark_delete(partition.ledger.position_of_index(0))
    await partition.close()
    partition = await open_partition(tmp_path / "p")  # a new ledger: the first one is closed
    await answers(partition.publish_normal(*batch(2, b"c")))

    async def retention_passes(count: int) -> int:
        """Dedup snapshots taken over `count` retention passes, none of which deletes anything."""
        before = partition.dedup.snapshots_stored
        for _ in range(count):
            assert await partition.enforce_retention(int(time.time() * 1000) + 10**6, 0, 0) == 0
            await partition.dedup.flush_snapshot()
        return partition.dedup.snapshots_stored - before

    assert await retention_passes(2) > 0  # the dedup cursor's records held the ledger back too: now they do not
    assert await retention_passes(3) == 0
    assert stored(partition) == [(0, b"a"), (1, b"b"), (2, b"c")]
    # Over the backlog quota, the replicator holds nothing back.
    assert await partition.enforce_retention(int(time.time() * 1000) + 10**6, 0, 0, replication_quota_bytes=1) > 0
    assert partition.log_start_offset >= 2  # what the replicator had not sent is gone
    await partition.close()
