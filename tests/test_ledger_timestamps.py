"""Finding entries by timestamp (ListOffsets by time): per-ledger max timestamps skip whole ledgers, batch header
max timestamps find the batch, with Kafka's answer: the first record in offset order whose timestamp is >= the
target, even when timestamps are out of order."""
import asyncio
import random

from kop.ledger import LedgerConfig, FileManagedLedger
from protocol.compression import LZ4, NONE
from protocol.records import Record, build_batch, iter_records

CONFIG = LedgerConfig(max_ledger_bytes=2048)


def open_ml(path):
    return FileManagedLedger.open("t", str(path), CONFIG, None)


async def append_batches(ml, batches: list[list[int]]) -> None:
    """One entry per batch of record timestamps; every other batch compressed."""
    futures = []
    for n, timestamps in enumerate(batches):
        base = ml.written_end_index
        records = [Record(base + i, ts, None, b"v" * 40) for i, ts in enumerate(timestamps)]
        futures.append(ml.add_entry(base, len(records), b"", build_batch(records, base_offset=base,
                                                                          compression=LZ4 if n % 2 else NONE)))
    await asyncio.gather(*futures)


def expected(batches: list[list[int]], target: int, from_index: int = 0) -> int | None:
    """First offset >= from_index whose record timestamp is >= target, by brute force."""
    offsets = (ts for batch in batches for ts in batch)
    return next((offset for offset, ts in enumerate(offsets) if offset >= from_index and ts >= target), None)


async def found(ml, target: int, from_index: int = 0) -> int | None:
    """What ListOffsets does with the ledger's answer: decode that one batch to find the record."""
    entry = await ml.find_by_timestamp(target, from_index)
    while entry is not None:
        for record in iter_records(entry.data):
            if record.timestamp >= target and record.offset >= from_index:
                return record.offset
        entry = await ml.find_by_timestamp(target, entry.first_index + entry.span)
    return None


def jittered_batches(seed: int, count: int) -> list[list[int]]:
    """Timestamps that mostly rise but step back now and then (CreateTime from several producers' clocks)."""
    rng = random.Random(seed)
    clock, batches = 1_700_000_000_000, []
    for _ in range(count):
        clock += rng.randrange(0, 1000)
        batches.append([clock + rng.randrange(-3000, 500) for _ in range(rng.randrange(1, 5))])
    return batches


async def test_the_first_record_at_or_after_a_timestamp_is_found_live_after_a_restart_and_after_a_crash(tmp_path):
    batches = jittered_batches(7, 120)
    timestamps = sorted({ts for batch in batches for ts in batch})
    targets = ([timestamps[0] - 1, timestamps[-1], timestamps[-1] + 1] + timestamps[::7]
               + [t + 1 for t in timestamps[::11]])

    async def check(ml):
        assert len(ml.internal_stats().ledgers) > 5
        for target in targets:
            assert await found(ml, target) == expected(batches, target), target
        for from_index in (1, 37, 150):  # from the middle of the log, and mid-ledger (after DeleteRecords)
            for target in targets[::5]:
                assert await found(ml, target, from_index) == expected(batches, target, from_index)

    ml = open_ml(tmp_path)
    await append_batches(ml, batches)
    await check(ml)
    await ml.close()
    ml = open_ml(tmp_path)  # recovered ledgers: max timestamps from ledgers.info, batch indexes built lazily
    await check(ml)
    more = jittered_batches(8, 10)
    await append_batches(ml, more)
    # no close: a crash, so the last ledger has no recorded max timestamp and must be read to be searched
    batches.extend(more)
    crashed = open_ml(tmp_path)
    await check(crashed)
    await crashed.close()
    await ml.close()


async def test_a_search_reads_only_the_ledger_that_holds_the_answer(tmp_path):
    ml = open_ml(tmp_path)
    batches = [[1_000 + 10 * i, 1_005 + 10 * i] for i in range(100)]
    await append_batches(ml, batches)
    await ml.close()
    ml = open_ml(tmp_path)
    ledgers = ml._ledgers
    assert len(ledgers) > 5 and all(l.times is None for l in ledgers[:-1])
    target = batches[-3][1]
    assert await found(ml, target) == expected(batches, target)
    holder = ml.position_of_index(expected(batches, target)).ledger_id
    assert holder > ledgers[0].ledger_id
    assert [l.ledger_id for l in ledgers if l.entries and l.times is not None] == [holder]
    await ml.close()


async def test_the_greatest_timestamp_and_its_first_record(tmp_path):
    ml = open_ml(tmp_path)
    assert await ml.max_timestamp(0) == -1
    batches = jittered_batches(3, 60)
    greatest = max(ts for batch in batches for ts in batch)
    await append_batches(ml, batches)
    assert await ml.max_timestamp(0) == greatest
    await ml.close()
    ml = open_ml(tmp_path)
    assert await ml.max_timestamp(0) == greatest
    assert await found(ml, greatest) == expected(batches, greatest)
    last_batch_start = ml.confirmed_end_index - len(batches[-1])
    assert await ml.max_timestamp(last_batch_start) == max(batches[-1])
    assert await ml.max_timestamp(ml.confirmed_end_index) == -1
    await ml.close()
