"""A damaged dedup cursor record after kill -9: dedup recovers from an older consistent snapshot, or from the start of
the log when none is left, never from the end, so an idempotent producer's retry of a stored batch is not stored twice.

The broker is killed with -9 after the batches are acknowledged, the newest `pulsar.dedup` record in the partition's
cursors.log is damaged on disk (as a bad sector or a torn write would), and the broker restarts on the same data.
"""
import glob
import os
import struct

import pytest

from integration.idem_raw import RawKafka, idempotent_batch
from proto.kop_pb2 import ManagedCursorInfo
from protocol.errors import ErrorCode

pytestmark = pytest.mark.file_storage  # the file engine's own files and descriptors

DEDUP_CURSOR = "pulsar.dedup"
BATCHES = 10
RECORDS_PER_BATCH = 5
HEADER = struct.Struct(">II")


def dedup_records(path: str) -> list[tuple[int, int]]:
    """(offset, length) of each intact pulsar.dedup record of a cursor log."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos + HEADER.size <= len(data):
        length, _crc = HEADER.unpack_from(data, pos)
        info = ManagedCursorInfo()
        info.ParseFromString(data[pos + HEADER.size:pos + HEADER.size + length])
        if info.name == DEDUP_CURSOR:
            out.append((pos, HEADER.size + length))
        pos += HEADER.size + length
    return out


def damage_length_field(path: str, offset: int) -> None:
    """Garble the record's length: the whole record, and without resynchronisation everything after it, is lost."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\x7f\xff\xff\xff")


@pytest.mark.parametrize("snapshots", ["only-the-creation-record", "several-snapshots"])
def test_retry_after_kill_9_and_a_damaged_dedup_cursor_record_is_stored_once(broker_factory, snapshots):
    # Without snapshots the dedup cursor holds one record (written when the topic was created, before any entry);
    # with an entry interval of 3 it holds several, and the one before the damaged newest is the fallback.
    interval = "1000000" if snapshots == "only-the-creation-record" else "3"
    broker = broker_factory({"brokerDeduplicationEnabled": "true", "brokerDeduplicationEntriesInterval": interval})
    topic = f"damaged-{snapshots}"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic, 1) == ErrorCode.NONE
        producer = kafka.init_producer_id()
        assert producer.error_code == ErrorCode.NONE
        batches, offsets = [], []
        for i in range(BATCHES):
            values = [b"%s-%d-%d" % (topic.encode(), i, j) for j in range(RECORDS_PER_BATCH)]
            batch = idempotent_batch(values, producer_id=producer.producer_id, epoch=producer.producer_epoch,
                                     base_sequence=i * RECORDS_PER_BATCH)
            answer = kafka.produce(topic, 0, batch)
            assert answer.error_code == ErrorCode.NONE, answer
            batches.append(batch)
            offsets.append(answer.base_offset)
    broker.kill()

    path, = glob.glob(os.path.join(broker.data_dir, "ledgers", "*", "*", f"{topic}-partition-0", "cursors.log"))
    records = dedup_records(path)
    assert len(records) >= (1 if snapshots == "only-the-creation-record" else 2), records
    damage_length_field(path, records[-1][0])
    broker.start()

    with RawKafka(broker.port) as kafka:
        retried = kafka.produce(topic, 0, batches[-1])  # the client never saw its answer: it sends it again
        assert (retried.error_code, retried.base_offset) == (ErrorCode.NONE, offsets[-1]) \
            or retried.error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER, retried
        stored = kafka.read_partition(topic, 0)
        assert len(stored) == BATCHES * RECORDS_PER_BATCH, "the retried batch was stored twice"
        assert len({r.value for r in stored}) == len(stored)
        # the producer goes on where it left off
        following = idempotent_batch([b"next"], producer_id=producer.producer_id, epoch=producer.producer_epoch,
                                     base_sequence=BATCHES * RECORDS_PER_BATCH)
        answer = kafka.produce(topic, 0, following)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, BATCHES * RECORDS_PER_BATCH), answer
