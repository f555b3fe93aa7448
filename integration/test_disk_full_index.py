"""A full disk that refuses only a ledger's index records. A ledger writes an entry to its log, fsyncs it, and once
INDEX_EVERY entries wait, writes their index records (not fsynced: the index is repaired from the log at open). On
a tmpfs a file takes space a page at a time, so when the log's last page still has room and the index file ends
exactly at a page boundary, the entry is stored and made durable and only the index records fail with ENOSPC.

Such a write is durable and must be answered as stored. Before, the exception escaped the ledger's group commit, and
the writes of that flush were never answered. A partition then refused every retry of the producer's batch (its first
write was still in flight), and the transaction state log left its transactional id answering
CONCURRENT_TRANSACTIONS, with any transaction it had open never timed out. The nemesis soak hit both at seed 20260
(a kafka-python partition that stopped taking records, and a transaction holding the last stable offset).
"""
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from integration.broker_process import BrokerProcess
from integration.idem_raw import RawKafka, idempotent_batch, read_topic
from integration.small_disk import Filler, free_bytes, small_disk
from kop.ledger.ledger_file import INDEX_EVERY  # ... written once this many wait (or at a roll)
from integration.txn_clients import READ_COMMITTED, RawTxnProducer, ck_read_to_end, init_transactional_id, values
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch

pytestmark = pytest.mark.file_storage  # the file engine's ledger files on a filesystem of their own

PAGE = 4096  # tmpfs gives a file its space a page at a time
INDEX_RECORD = 16  # [i64 first index][i64 file position] per entry (kop/ledger/ledger_file.py) ...
LOG_END_IN_PAGE = 256  # where the log's last entry before the fault ends in its page: the next ones fit after it
INDEX_REFUSED = "index not written"  # the broker's warning: the control that the index write was the one refused


def newest_ledger(directory: str) -> tuple[str, str]:
    """The log and index files of the ledger being written in a managed ledger's directory."""
    newest = max(int(name[:-4]) for name in os.listdir(directory) if name.endswith(".log") and name[:-4].isdigit())
    return os.path.join(directory, f"{newest}.log"), os.path.join(directory, f"{newest}.idx")


def fill_index_page(directory: str, write: Callable[[list[int]], None]) -> None:
    """Append entries one at a time (`write([pad])` appends one, `pad` bytes larger than the smallest, and waits for
    its answer, so each is a flush of its own) until the ledger being written holds INDEX_EVERY - 1 entries whose
    index records wait to be written, its index file ends exactly at a page boundary, and its log ends
    LOG_END_IN_PAGE bytes into a page: the next entry then fits in the log's page, and writing the index records
    it completes needs a new page."""
    log_path, idx_path = newest_ledger(directory)
    idx_size = os.path.getsize(idx_path)
    for _ in range(6 * PAGE // INDEX_RECORD):  # a page of index records is PAGE // INDEX_RECORD entries
        write([0])
        if os.path.getsize(idx_path) != idx_size:  # the index was just written: nothing waits now
            idx_size = os.path.getsize(idx_path)
            if idx_size % PAGE == 0:
                break
    else:
        pytest.fail(f"the index of {idx_path} never reached a page boundary ({idx_size} bytes)")
    for _ in range(INDEX_EVERY - 3):
        write([0])
    before = os.path.getsize(log_path)
    write([0])
    step = os.path.getsize(log_path) - before  # the padded entry's size is estimated: a varint may grow a byte
    write([(LOG_END_IN_PAGE - before - 2 * step) % PAGE])
    log_size = os.path.getsize(log_path)
    assert os.path.getsize(idx_path) == idx_size, "the index was written before INDEX_EVERY entries waited"
    assert log_size % PAGE <= 2 * LOG_END_IN_PAGE, f"could not line the log up: {log_size} bytes"


def fill_disk(data: str) -> Filler:
    filler = Filler(data)
    filler.fill()
    assert free_bytes(data) < PAGE, "the filler left a page free"  # the control: not one page for a new record
    return filler


@contextlib.contextmanager
def broker_on_a_small_disk(tmp_path) -> Iterator[tuple[BrokerProcess, str]]:
    """A broker whose data directory is a tmpfs of its own (skips where one cannot be mounted); the filler goes
    with it."""
    with small_disk(str(tmp_path / "data"), size_mb=16) as data:
        broker = BrokerProcess(data)
        try:
            broker.start()
            yield broker, data
        finally:
            broker.stop()
            Filler(data).remove()


def broker_log(broker: BrokerProcess) -> str:
    with open(broker.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def test_a_batch_whose_index_record_a_full_disk_refuses_is_stored_answered_and_read_back(tmp_path):
    """The idempotent producer's batch is answered with its offset while the disk is full, its retry is a
    duplicate, writes go on once space is freed, and every batch is read back once (the index left behind is caught
    up by the next write; its repair at open: tests/test_ledger_disk_full.py)."""
    with broker_on_a_small_disk(tmp_path) as (broker, data):
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("indexed", 1) == ErrorCode.NONE
            producer = kafka.init_producer_id()
            sent: list[bytes] = []

            def produce(pads: list[int]) -> list[int]:
                """One batch of one record per pad, all sent before the first answer is read; their offsets."""
                sending = []
                for pad in pads:
                    value = b"%d-" % len(sent) + b"p" * pad
                    batch = idempotent_batch([value], producer_id=producer.producer_id,
                                             epoch=producer.producer_epoch, base_sequence=len(sent))
                    sending.append(kafka.send_produce("indexed", 0, batch))
                    sent.append(value)
                answers = [kafka.receive_produce(correlation_id) for correlation_id in sending]
                assert all(a.error_code == ErrorCode.NONE for a in answers), answers
                return [a.base_offset for a in answers]

            fill_index_page(os.path.join(data, "ledgers", "public", "default", "indexed-partition-0"), produce)
            filler = fill_disk(data)
            assert produce([0]) == [len(sent) - 1]  # before, never answered: the read timed out
            retry = idempotent_batch([sent[-1]], producer_id=producer.producer_id, epoch=producer.producer_epoch,
                                     base_sequence=len(sent) - 1)
            assert kafka.produce("indexed", 0, retry).base_offset == len(sent) - 1  # a duplicate, not stored
            assert INDEX_REFUSED in broker_log(broker)  # the control: it was the index record that failed
            filler.remove()
            produce([0, 0, 0])
        stored = read_topic(broker.port, "indexed", [0])
        assert [(r.offset, r.value) for r in stored] == list(enumerate(sent))


def test_a_transition_whose_index_record_a_full_disk_refuses_is_answered_and_its_transaction_ends(tmp_path):
    """AddPartitionsToTxn whose state-log record lands while only its index record is refused is answered; the
    transaction then commits, and the transactional id takes the next InitProducerId (it does not answer
    CONCURRENT_TRANSACTIONS for ever)."""
    with broker_on_a_small_disk(tmp_path) as (broker, data):
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("wedged", 1) == ErrorCode.NONE
            txn = RawTxnProducer(kafka, "writer")
            assert txn.add_partitions("wedged", [0]) == {0: ErrorCode.NONE}  # marks the partition transactional
            assert kafka.produce("wedged", 0, txn_batch(b"first", txn, 0)).error_code == ErrorCode.NONE
            assert txn.end(commit=True) == ErrorCode.NONE
            ids = itertools.count()

            def transitions(pads: list[int]) -> None:
                """InitProducerId of a new transactional id per pad, all sent before the first answer is read:
                one state-log record each, the longer the id, the larger."""
                sending = [kafka.send(InitProducerIdRequest[4](transactional_id=f"{next(ids)}-" + "p" * pad,
                                                               transaction_timeout_ms=60_000, producer_id=-1,
                                                               producer_epoch=-1)) for pad in pads]
                answers = [kafka.receive(c, InitProducerIdResponse, 4) for c in sending]
                assert all(a.error_code == ErrorCode.NONE for a in answers), answers

            fill_index_page(os.path.join(data, "transactions"), transitions)
            filler = fill_disk(data)
            assert txn.add_partitions("wedged", [0]) == {0: ErrorCode.NONE}  # before, never answered
            assert INDEX_REFUSED in broker_log(broker)  # the control: it was the index record that failed
            filler.remove()
            assert kafka.produce("wedged", 0, txn_batch(b"second", txn, 1)).error_code == ErrorCode.NONE
            assert txn.end(commit=True) == ErrorCode.NONE
            error, producer_id, epoch = init_transactional_id(kafka, "writer", producer_id=txn.producer_id,
                                                              producer_epoch=txn.epoch)
            assert (error, producer_id, epoch) == (ErrorCode.NONE, txn.producer_id, txn.epoch + 1)
        assert values(ck_read_to_end(broker.bootstrap, "wedged", isolation=READ_COMMITTED)) == [b"first", b"second"]


def txn_batch(value: bytes, txn: RawTxnProducer, base_sequence: int) -> bytes:
    record = Record(offset=0, timestamp=1_700_000_000_000, key=None, value=value)
    return build_batch([record], producer_id=txn.producer_id, producer_epoch=txn.epoch, base_sequence=base_sequence,
                       transactional=True)
