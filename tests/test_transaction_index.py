"""The aborted-transaction index kept with each ledger: its stored form and cache, and the lookups of a partition
whose transactions span many ledger rolls, compared with one list of every aborted transaction searched as Kafka
searches its segments' indexes (as the partition searched its single list before the index was kept by ledger):
live, after a crash and a reload (with index writes failing before it), with a cold cache, after retention and after
compaction."""
import asyncio
import random
import time
from bisect import bisect_left

import pytest

from dedup import DedupConfig
from kop.compaction.rewrite import CompactionJob, compact
from kop.ledger import FileManagedLedger, LedgerConfig
from kop.partition import PartitionLog
from kop.transactions.aborted_index import AbortedTxn, DamagedIndex, LedgerAborts
from kop.transactions.index_cache import IndexCache
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, control_marker, iter_records, split_batches

LEDGER_BYTES = 1500  # about 15 entries a ledger
CAP = 3  # aborted transactions a ledger holds before it rolls


# ---- the stored form

def some_aborts(count: int) -> LedgerAborts:
    aborts = LedgerAborts()
    for i in range(count):
        aborts.append(AbortedTxn(1000 + i % 3, 10 * i, 10 * i + 5, 10 * i + 6))
    return aborts


def test_an_index_round_trips_through_its_stored_bytes_and_its_snapshot_text():
    aborts = some_aborts(50)
    aborts.append(AbortedTxn((1 << 62) + 1, 400, 600, 601))
    decoded = LedgerAborts.decode(aborts.encode())
    assert list(decoded) == list(aborts) and decoded.summary() == aborts.summary()
    assert list(LedgerAborts.from_text(aborts.to_text())) == list(aborts)
    assert list(LedgerAborts.decode(LedgerAborts().encode())) == []
    assert len(aborts.encode()) == 9 + 32 * 51 + 4


@pytest.mark.parametrize("damage", ["flipped bit", "cut short", "longer", "other magic"])
def test_a_damaged_index_is_refused(damage):
    data = bytearray(some_aborts(5).encode())
    if damage == "flipped bit":
        data[40] ^= 1
    elif damage == "cut short":
        del data[-9:]
    elif damage == "longer":
        data += b"\0" * 32
    else:
        data[0:4] = b"XXXX"
    with pytest.raises(DamagedIndex):
        LedgerAborts.decode(bytes(data))


def test_the_cache_keeps_the_most_recently_used_indexes_within_its_bytes():
    cache = IndexCache(max_bytes=3 * 32 * 10)
    owner, other = cache.new_owner(), cache.new_owner()
    for ledger_id in range(3):
        cache.put(owner, ledger_id, some_aborts(10))
    assert cache.get(owner, 0) is not None  # now the most recently used
    cache.put(other, 0, some_aborts(10))  # another partition's ledger 0: ledger 1 goes
    assert cache.get(owner, 1) is None and cache.get(owner, 2) is not None and cache.get(other, 0) is not None
    assert cache.bytes == 3 * 320
    cache.put(owner, 9, some_aborts(31))  # larger than the whole cache: not kept, nothing evicted for it
    assert cache.get(owner, 9) is None and len(cache) == 3
    cache.discard_owner(owner)
    assert len(cache) == 1 and cache.bytes == 320


# ---- lookups through a partition, against one list searched as before

def open_partition(path, cache: IndexCache | None = None) -> PartitionLog:
    ledger = FileManagedLedger.open("t-0", str(path), LedgerConfig(fsync=False, max_ledger_bytes=LEDGER_BYTES), None)
    return PartitionLog("t", 0, ledger, DedupConfig(), index_cache=cache, max_aborted_per_ledger=CAP)


def batch(producer_id: int = -1, sequence: int = -1, key: bytes | None = None):
    records = [Record(offset=0, timestamp=1_700_000_000_000, key=key, value=b"v")]
    return split_batches(build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=sequence,
                                     transactional=producer_id >= 0))[0]


async def write_transactions(partition: PartitionLog, rng: random.Random, steps: int, fail_writes: bool) -> None:
    """Producers 1-3 interleave transactions of a few batches each, committed or (mostly) aborted, with plain
    batches between; some writes of different producers go together into one group commit (so a marker can be
    stored with the high watermark past it), some retention passes roll an idle ledger, some index writes fail."""
    sequences: dict[int, int] = {}
    opened: set[int] = set()
    for step in range(steps):
        writes = []
        for producer_id in rng.sample((1, 2, 3), rng.choice((1, 1, 1, 2, 3))):
            action = rng.random()
            if producer_id in opened and action < 0.35:
                writes.append(partition.publish_control(producer_id, 0, commit=rng.random() < 0.3))
                opened.discard(producer_id)
            elif action < 0.85:
                sequence = sequences.get(producer_id, 0)
                writes.append(partition.publish_normal(*batch(producer_id, sequence)))
                sequences[producer_id] = sequence + 1
                opened.add(producer_id)
            else:
                writes.append(partition.publish_normal(*batch()))
        assert all(result.error == ErrorCode.NONE for result in await asyncio.gather(*writes))
        if rng.random() < 0.05:
            await partition.enforce_retention(int(time.time() * 1000), -1, -1)
        if fail_writes and step % 40 == 20:
            partition.ledger.inject_txn_index_write_failures(2)


def aborts_in_log(partition: PartitionLog) -> list[tuple[int, int, int]]:
    """(producer id, first offset, marker offset) of each aborted transaction, read from the log."""
    opened: dict[int, int] = {}
    aborted = []
    for entry in partition.ledger.read_from_index(partition.log_start_offset, 1 << 30):
        for header, view in split_batches(entry.data):
            if header.is_control:
                first = opened.pop(header.producer_id, None)
                if first is not None and not control_marker(next(iter_records(view))).commit:
                    aborted.append((header.producer_id, first, header.base_offset))
            elif header.is_transactional:
                opened.setdefault(header.producer_id, header.base_offset)
    return aborted


def one_list_lookup(aborted: list[AbortedTxn], fetch_offset: int, upper: int) -> list[tuple[int, int]]:
    """The search of a single list of every aborted transaction, in marker order (Kafka's, within a segment)."""
    out = []
    for txn in aborted[bisect_left([t.last_offset for t in aborted], fetch_offset):]:
        if txn.first_offset < upper:
            out.append((txn.producer_id, txn.first_offset))
        if txn.last_stable_offset >= upper:
            break
    return out


async def lookups(partition: PartitionLog, every: int = 1) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """What fetches at each entry's (or every `every`th's) first and last offset list, returning 1, 2, 4, 11
    entries or all of them."""
    entries = partition.ledger.read_from_index(partition.log_start_offset, 1 << 30)
    ends = [entry.first_index + entry.span for entry in entries]
    answers = {}
    for i, entry in list(enumerate(entries))[::every]:
        for offset in {entry.first_index, entry.first_index + entry.span - 1}:
            for j in {i, i + 1, i + 3, i + 10, len(entries) - 1}:
                if j < len(entries):
                    answers[(offset, ends[j])] = await partition.aborted_transactions(entry, offset, ends[j])
    return answers


async def written(path, seed: int, steps: int) -> tuple[PartitionLog, list[AbortedTxn], dict]:
    """A partition of write_transactions' aborted transactions over many ledgers: it, its aborts (as its indexes
    list them) and its lookups' answers."""
    partition = open_partition(path)
    await partition.apply_dedup_policy(False)
    await partition.expect_transactions()
    await write_transactions(partition, random.Random(seed), steps, fail_writes=False)
    return partition, await partition.transactions.indexes.listed(), await lookups(partition)


async def crash(partition: PartitionLog) -> None:
    """Stop as a kill -9 would, once the writes begun are done: no snapshot at close, no index write after."""
    await partition.transactions.indexes.wait_writes()
    await partition.transaction_snapshots.flush()
    await partition.ledger.close()


@pytest.mark.parametrize("seed", range(4))
async def test_lookups_across_ledger_rolls_match_one_list_before_and_after_a_crash_and_retention(tmp_path, seed):
    rng = random.Random(seed)
    fail_writes = seed % 2 == 1
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(False)
    await partition.expect_transactions()
    await write_transactions(partition, rng, 300, fail_writes)
    await partition.enforce_retention(int(time.time() * 1000), -1, -1)  # stores what an idle roll closed
    await partition.transactions.indexes.wait_writes()

    aborted = await partition.transactions.indexes.listed()
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in aborted] == aborts_in_log(partition)
    ledgers = {partition.ledger.position_of_index(t.last_offset).ledger_id for t in aborted}
    assert len(aborted) >= 30 and len(ledgers) >= 10  # control: many aborts over many ledgers
    answers = await lookups(partition)
    assert all(answer == one_list_lookup(aborted, *key) for key, answer in answers.items())
    assert sum(map(bool, answers.values())) > len(answers) // 4  # control: most list something
    current = partition.ledger.internal_stats().current_ledger_id
    in_memory = set(partition.transactions.indexes.in_memory())
    if fail_writes:  # control: some closed ledgers' indexes were not stored, and stay in memory
        assert in_memory - {current}
    else:  # only the open ledger's index is in memory
        assert in_memory <= {current}
    assert set(partition.ledger.txn_indexed_ledgers()) == ledgers - in_memory
    await crash(partition)

    partition = open_partition(tmp_path)
    replayed = await partition.load_transactions()
    assert replayed < 1000  # the entries after the last snapshot, not the log
    assert await partition.transactions.indexes.listed() == aborted
    assert set(partition.ledger.txn_indexed_ledgers()) == ledgers  # every closed ledger's index is stored now
    assert partition.transactions.indexes.in_memory() == {}
    assert await lookups(partition) == answers
    await partition.close()

    cache = IndexCache(max_bytes=64)  # two transactions: almost every lookup reads the ledgers' indexes
    partition = open_partition(tmp_path, cache)
    assert await partition.load_transactions() == 0  # closed cleanly: its last snapshot is at its last entry
    cold = await lookups(partition, every=5)
    assert cold and all(answer == answers[key] for key, answer in cold.items())
    assert cache.bytes <= 64 and cache.misses > len(ledgers)

    start = partition.log_start_offset
    for _ in range(4):  # its snapshots move on with each pass, the ledgers behind them go
        await partition.enforce_retention(int(time.time() * 1000) + 10_000, 0, -1)
        await partition.transaction_snapshots.flush()
    assert partition.log_start_offset > start  # control: retention deleted ledgers with aborts
    assert len(partition.ledger.txn_indexed_ledgers()) < len(ledgers)
    after = await lookups(partition)
    assert after and all(answer == answers[key] for key, answer in after.items())
    await partition.close()


async def test_a_ledger_whose_index_was_not_stored_is_rebuilt_from_the_snapshot_and_its_own_entries(tmp_path):
    """The index write of the ledger closed last fails, then a crash: the load reads only the entries after the
    snapshot (in that ledger and the one after it) and stores that ledger's index."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(False)
    await partition.expect_transactions()
    for sequence in range(CAP):  # the 3rd abort asks for a roll
        assert (await partition.publish_normal(*batch(7, sequence))).error == ErrorCode.NONE
        if sequence == 1:
            assert partition.transaction_snapshots.snapshot_now()
            await partition.transaction_snapshots.flush()
        assert (await partition.publish_control(7, 0, commit=False)).error == ErrorCode.NONE
    closing = partition.ledger.last_confirmed.ledger_id
    partition.ledger.inject_txn_index_write_failures(1)
    assert (await partition.publish_normal(*batch(7, CAP))).error == ErrorCode.NONE  # in the next ledger
    await partition.transactions.indexes.wait_writes()
    assert partition.ledger.last_confirmed.ledger_id == closing + 1
    assert partition.ledger.txn_indexed_ledgers() == []  # control: the write failed
    aborted = await partition.transactions.indexes.listed()
    await crash(partition)

    partition = open_partition(tmp_path)
    assert await partition.load_transactions() == 4  # 2 aborts' last 3 entries, then the next ledger's batch
    assert partition.ledger.txn_indexed_ledgers() == [closing]
    assert await partition.transactions.indexes.listed() == aborted and len(aborted) == CAP
    assert partition.transactions.open == {7: aborted[-1].last_offset + 1}
    await partition.close()


async def test_a_snapshot_of_the_single_list_is_read_by_ledger(tmp_path):
    """A partition written before the index was kept by ledger: its snapshot lists every aborted transaction at
    once (version 1). The load puts each in the index of the ledger holding its marker, and stores them."""
    partition, aborted, answers = await written(tmp_path, seed=7, steps=120)
    version_1 = {"txn.version": "1", "txn.end": str(partition.high_watermark),
                 "txn.open": ",".join(f"{p}:{f}" for p, f in partition.transactions.open.items()),
                 "txn.aborted": ";".join(f"{t.producer_id}:{t.first_offset}:{t.last_offset}:{t.last_stable_offset}"
                                         for t in aborted)}
    await partition.transaction_snapshots.flush()
    cursor = partition.ledger.cursors["pulsar.transactions"]
    await cursor.mark_delete(partition.ledger.last_confirmed, string_properties=version_1)
    await partition.transactions.indexes.wait_writes()
    await partition.ledger.close()
    for path in tmp_path.glob("*.txnindex"):  # as that version left them: no index beside any ledger
        path.unlink()

    partition = open_partition(tmp_path)
    assert await partition.load_transactions() == 0
    assert await partition.transactions.indexes.listed() == aborted
    assert len(partition.ledger.txn_indexed_ledgers()) > 5
    assert await lookups(partition) == answers
    await partition.close()


async def test_lookups_and_stored_indexes_are_the_same_after_compaction_rewrites_the_ledgers(tmp_path):
    """The cleaner rewrites closed ledgers in place (same ids and offsets, transactional and control batches whole):
    each ledger's stored index stays true, is kept, and answers as before, also after a reload."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(False)
    await partition.expect_transactions()
    rng = random.Random(11)
    for sequence in range(40):  # a transaction of producer 5 around plain records of a few keys, most aborted
        assert (await partition.publish_normal(*batch(5, sequence))).error == ErrorCode.NONE
        assert (await partition.publish_normal(*batch(key=b"k%d" % rng.randrange(3)))).error == ErrorCode.NONE
        assert (await partition.publish_control(5, 0, commit=sequence % 4 == 0)).error == ErrorCode.NONE
    await partition.transactions.indexes.wait_writes()
    aborted = await partition.transactions.indexes.listed()
    answers = await lookups(partition)
    stored = {path.name: path.read_bytes() for path in tmp_path.glob("*.txnindex")}
    assert len(aborted) == 30 and len(stored) >= 5  # control: aborts stored with many closed ledgers

    ledger = partition.ledger
    result = compact(CompactionJob("t-0", "test", tuple(ledger.closed_ledgers()), 0, ledger.config.max_entry_bytes,
                                   False))
    assert result.records_removed > 0 and all(ledger.install_compacted(r) for r in result.rewritten)
    assert result.rewritten  # control: ledgers were rewritten and installed
    assert {path.name: path.read_bytes() for path in tmp_path.glob("*.txnindex")} == stored
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in aborted] == aborts_in_log(partition)
    assert await partition.transactions.indexes.listed() == aborted
    assert await lookups(partition) == answers
    await partition.close()

    partition = open_partition(tmp_path, IndexCache(max_bytes=0))  # every lookup reads the stored indexes
    assert await partition.load_transactions() == 0
    assert await partition.transactions.indexes.listed() == aborted
    assert await lookups(partition) == answers
    await partition.close()


async def write_and_close(tmp_path) -> tuple[list[AbortedTxn], dict, list[int]]:
    """A partition of aborted transactions over many ledgers, closed cleanly: its aborts, its lookups' answers and
    the ledgers whose index is stored (and the open ledger's, in memory and in the last snapshot)."""
    partition, aborted, answers = await written(tmp_path, seed=5, steps=200)
    await partition.close()
    return aborted, answers, partition.ledger.txn_indexed_ledgers() + list(partition.transactions.indexes.in_memory())


def identities(aborted: list[AbortedTxn]) -> list[tuple[int, int, int]]:
    return [(t.producer_id, t.first_offset, t.last_offset) for t in aborted]


async def test_a_stored_index_gone_missing_is_rebuilt_from_the_log_at_load(tmp_path):
    aborted, answers, stored = await write_and_close(tmp_path)
    assert len(stored) >= 5  # control: many ledgers' indexes stored, before the clean close's snapshot
    for ledger_id in stored[1:4]:
        (tmp_path / f"{ledger_id}.txnindex").unlink()

    partition = open_partition(tmp_path, IndexCache(max_bytes=0))
    assert await partition.load_transactions() == 0  # its snapshot is at its last entry: no entry after it
    assert partition.ledger.txn_indexed_ledgers() == stored  # rebuilt and stored again (the open one's stored too)
    assert identities(await partition.transactions.indexes.listed()) == identities(aborted) == \
        aborts_in_log(partition)
    assert await lookups(partition) == answers
    await partition.close()


async def test_a_damaged_stored_index_is_rebuilt_from_the_log_when_a_fetch_reads_it(tmp_path):
    aborted, answers, stored = await write_and_close(tmp_path)
    damaged = tmp_path / f"{stored[2]}.txnindex"
    data = bytearray(damaged.read_bytes())
    data[20] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(DamagedIndex):  # control: it fails its CRC
        LedgerAborts.decode(damaged.read_bytes())

    partition = open_partition(tmp_path, IndexCache(max_bytes=0))  # every lookup reads the stored indexes
    assert await partition.load_transactions() == 0
    assert await lookups(partition) == answers
    await partition.transactions.indexes.wait_writes()
    assert identities(LedgerAborts.decode(damaged.read_bytes())) == \
        [t for t in identities(aborted) if partition.ledger.position_of_index(t[2]).ledger_id == stored[2]]
    assert partition.ledger.txn_indexed_ledgers() == stored and partition.transactions.indexes.in_memory() == {}
    await partition.close()


async def test_a_stored_index_removed_while_the_partition_runs_is_rebuilt_when_a_fetch_reads_it(tmp_path):
    aborted, answers, stored = await write_and_close(tmp_path)
    partition = open_partition(tmp_path, IndexCache(max_bytes=0))  # every lookup reads the stored indexes
    assert await partition.load_transactions() == 0
    removed = tmp_path / f"{stored[3]}.txnindex"
    removed.unlink()
    assert stored[3] in partition.ledger.txn_indexed_ledgers()  # control: the engine still holds it
    assert await lookups(partition) == answers
    await partition.transactions.indexes.wait_writes()
    assert removed.exists() and partition.transactions.indexes.in_memory() == {}  # rebuilt and stored again
    assert identities(await partition.transactions.indexes.listed()) == identities(aborted)
    await partition.close()
