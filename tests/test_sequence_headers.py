"""Reading application-chosen sequence ids from record batches (the walk validation makes finds the headers) and
rewriting a batch without some of its records, as Kafka's log cleaner does: offsets, producer fields and codec kept,
count, maxTimestamp and CRC recomputed."""
import pytest

from protocol.compression import CODEC_NAMES, RecordBatchError
from protocol.errors import ErrorCode
from protocol.records import (Record, build_batch, iter_records, keep_records, record_spans, split_batches,
                              validate_batch)
from protocol.sequence_headers import SequenceHeaderScan, sequenced_records

NAME, SEQUENCE = "kop.producer.name", "kop.sequence.id"


def batch(records: list[tuple], compression: int = 0, producer_id: int = -1) -> bytes:
    return build_batch([Record(offset=i, timestamp=1_000 + 10 * i, key=b"k%d" % i, value=value, headers=headers)
                        for i, (value, headers) in enumerate(records)], compression=compression,
                       producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                       base_sequence=0 if producer_id >= 0 else -1)


def walked(raw: bytes):
    [(header, view)] = split_batches(raw)
    return header, validate_batch(header, view, watch=SequenceHeaderScan)


def pairs(records) -> list[tuple]:
    """(name, id) of each record that carries them, in order."""
    sequenced = sequenced_records(records.headers)
    return list(zip(sequenced.indexes, sequenced.names, sequenced.ids))


def ids(name: str, sequence: int, **other: bytes) -> tuple:
    return ((NAME, name.encode()), (SEQUENCE, str(sequence).encode()), *other.items())


def test_a_batch_without_the_headers_finds_nothing():
    _, records = walked(batch([(b"a", (("trace", b"x"), ("kop.producer.nam", b"y"), ("kop.sequence.ie", b"1"))),
                               (b"b", ())]))
    assert records.headers is None


def test_names_and_ids_are_read_per_record_wherever_the_headers_stand():
    _, records = walked(batch([(b"a", ids("p", 7)), (b"b", ()), (b"c", ((SEQUENCE, b"9"), ("x", b"y"), (NAME, b"q")))]))
    assert pairs(records) == [(0, "p", 7), (2, "q", 9)]
    assert sequenced_records(records.headers).name is None  # two names: judged record by record


def test_a_producers_run_of_one_name_is_read_by_its_shape_and_names_it():
    """The records after the first `[name, id]` one are read by one comparison; any other record among them is read
    header by header, and the run still yields every record's pair in order."""
    run = [(b"v%d" % i, ids("p", i)) for i in range(5)]
    run[2] = (b"v2", ids("q", 2))  # another name
    run[3] = (b"v3", (("x", b"y"),) + ids("p", 3))  # another shape
    run[4] = (b"v4", ids("p", 10**17))  # an id of another length
    _, records = walked(batch(run))
    assert pairs(records) == [(0, "p", 0), (1, "p", 1), (2, "q", 2), (3, "p", 3), (4, "p", 10**17)]
    _, records = walked(batch([(b"v%d" % i, ids("p", i)) for i in range(4)]))
    assert sequenced_records(records.headers).name == "p"


@pytest.mark.parametrize("headers, complaint", [
    (((NAME, b"p"),), f"header {NAME} comes without {SEQUENCE}"),
    (((SEQUENCE, b"1"),), f"header {SEQUENCE} comes without {NAME}"),
    (((NAME, b"p"), (SEQUENCE, b"1"), (SEQUENCE, b"2")), f"header {SEQUENCE} appears twice"),
    (((NAME, None), (SEQUENCE, b"1")), f"header {NAME} is empty"),
    (((NAME, b"p"), (SEQUENCE, None)), f"header {SEQUENCE} must be a decimal ASCII integer"),
    (((NAME, b"p"), (SEQUENCE, b"\xd9\xa1")), f"header {SEQUENCE} must be a decimal ASCII integer"),  # Arabic 1
    (((NAME, b"p"), (SEQUENCE, b"99999999999999999999")), f"header {SEQUENCE} 99999999999999999999 is beyond int64"),
])
def test_malformed_headers_name_the_header_and_the_record(headers, complaint):
    _, records = walked(batch([(b"ok", ids("p", 0)), (b"bad", headers), (b"bad too", ((NAME, b""), (SEQUENCE, b"x")))]))
    with pytest.raises(RecordBatchError) as refused:
        sequenced_records(records.headers)
    assert refused.value.error_code == ErrorCode.INVALID_RECORD
    assert str(refused.value).startswith("record 1: ") and complaint in str(refused.value)


def test_the_largest_int64_is_a_valid_id():
    _, records = walked(batch([(b"a", ids("p", 2**63 - 1)), (b"b", ids("p", 0))]))
    assert pairs(records) == [(0, "p", 2**63 - 1), (1, "p", 0)]


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_keeping_some_records_keeps_their_offsets_and_the_batch_shape(codec):
    raw = batch([(b"v%d" % i, ids("p", i)) for i in range(5)], compression=codec, producer_id=9)
    header, records = walked(raw)
    kept = [record_spans(header, records.data, records.start)[i] for i in (1, 3)]
    rewritten = keep_records(header, records.data, [(r[0], r[1]) for r in kept], 1_000 + 30)
    [(new, view)] = split_batches(rewritten)
    validate_batch(new, view, from_client=False)  # a sound batch, with holes
    assert (new.base_offset, new.last_offset_delta, new.records_count, new.compression) == (0, 4, 2, codec)
    assert (new.producer_id, new.producer_epoch, new.base_sequence, new.max_timestamp) == (9, 0, 0, 1_030)
    assert [(r.offset, r.value, r.timestamp) for r in iter_records(rewritten)] == [(1, b"v1", 1_010), (3, b"v3", 1_030)]


def test_keeping_no_record_gives_an_uncompressed_empty_batch_over_the_same_offsets():
    header, records = walked(batch([(b"v%d" % i, ids("p", i)) for i in range(3)], compression=3, producer_id=9))
    [(empty, view)] = split_batches(keep_records(header, records.data, [], header.max_timestamp))
    validate_batch(empty, view, from_client=False)
    assert (empty.records_count, empty.last_offset_delta, empty.compression, empty.base_sequence) == (0, 2, 0, 0)
    assert list(iter_records(bytes(view))) == []
