"""Large cursor records (a dedup snapshot of many producers) are encoded in a worker thread, so the event loop keeps
serving meanwhile, and still reach the log in the order their cursor wrote them."""
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import kop.ledger.cursor_log as cursor_log
from kop.ledger import LedgerConfig, FileManagedLedger
from proto.kop_pb2 import MessageMetadata

LARGE = {f"producer-{i}": i for i in range(cursor_log.LARGE_RECORD_PROPERTIES)}


def open_ml(path, executor):
    return FileManagedLedger.open("t", str(path), LedgerConfig(), executor)


async def one_entry(ml):
    return await ml.add_entry(ml.written_end_index, 1, MessageMetadata(producer_name="p").SerializeToString(), b"x")


async def test_a_large_record_is_encoded_off_the_event_loop(tmp_path, monkeypatch):
    threads: list[str] = []
    original = cursor_log._state_record

    def state_record(*args):
        threads.append(threading.current_thread().name)
        return original(*args)

    monkeypatch.setattr(cursor_log, "_state_record", state_record)

    async def scenario():
        with ThreadPoolExecutor(2, thread_name_prefix="fsync") as executor:
            ml = open_ml(tmp_path, executor)
            position = await one_entry(ml)
            cursor = ml.open_cursor("pulsar.dedup", position)
            await cursor.mark_delete(position, {"small": 1})
            await cursor.mark_delete(position, LARGE)
            await ml.close()
            reopened = open_ml(tmp_path, executor)
            properties = reopened.cursors["pulsar.dedup"].properties
            await reopened.close()
            return properties

    assert await scenario() == LARGE
    assert threads[0] == threading.main_thread().name and threads[1].startswith("fsync"), threads


async def test_a_cursors_records_reach_the_log_in_the_order_it_wrote_them(tmp_path):
    """A deletion written while the cursor's large record is still being encoded lands after it: the cursor stays
    deleted after a restart. Another cursor's small record does not wait for it."""
    async def scenario():
        with ThreadPoolExecutor(2) as executor:
            ml = open_ml(tmp_path, executor)
            position = await one_entry(ml)
            big = ml.open_cursor("big", position)
            other = ml.open_cursor("other", position)
            large = asyncio.ensure_future(big.mark_delete(position, LARGE))
            await asyncio.sleep(0)  # it is being encoded
            deleted = asyncio.ensure_future(ml.delete_cursor("big"))
            await other.mark_delete(position, {"o": 7})
            await asyncio.gather(large, deleted)
            await ml.close()
            reopened = open_ml(tmp_path, executor)
            cursors = {name: dict(c.properties) for name, c in reopened.cursors.items()}
            await reopened.close()
            return cursors

    assert await scenario() == {"other": {"o": 7}}
