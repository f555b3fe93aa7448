"""Capture record batches as real Python Kafka clients encode them, with no broker involved.

Run from the repository root:  .venv/bin/python tests/data/make_golden.py
It writes, for each client and each of the five compression settings, the bytes of one record batch
(`<client>_<codec>.bin`), and `golden.json` with the records and producer fields that went into them. The files
are committed; tests/test_records.py reads them. capture_via_kop.py adds librdkafka's and the Java client's. Gzip output carries a timestamp, so a rerun changes those bytes
but not what they decode to.

- kafka-python 3.0.12: kafka.record.default_records.DefaultRecordBatchBuilder, the encoder its KafkaProducer uses.
  kafka-python compresses snappy with the `python-snappy` module, which this project does not install; a stand-in
  module backed by cramjam gives it raw snappy blocks, while the xerial framing around them is kafka-python's own.
- aiokafka 0.14.0: aiokafka.record.default_records.DefaultRecordBatchBuilder, the compiled (Cython) builder its
  producer uses (it compresses through cramjam).
Both clients send a batch uncompressed when compression would not shrink it, so the values are made repetitive.
"""
import json
import pathlib
import types

import aiokafka.record.default_records as aiokafka_records
import cramjam
import kafka.codec
import kafka.record.default_records as kafka_python_records

HERE = pathlib.Path(__file__).parent
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# (offset delta, timestamp ms, key, value, headers): null key and value, an empty key, a header with a null value,
# a non-ASCII header key, timestamps out of order (maxTimestamp is not the last record's).
RECORDS = [
    (0, 1_700_000_000_000, b"user-1", b"checkout:" + b"apple," * 40, [("trace-id", b"abc123")]),
    (1, 1_700_000_000_250, None, b"no key here " * 30, []),
    (2, 1_700_000_000_100, b"", b"empty key, " * 30, [("n\u00e4me", b"\x00\x01\x02"), ("null-value", None)]),
    (3, 1_700_000_000_300, b"user-2", None, [("seq", b"7")]),
    (4, 1_700_000_000_300, b"user-3", b"last record " * 30, []),
]

# Producer fields per client: kafka-python as a plain producer; aiokafka as an idempotent one whose sequence is
# about to wrap past 2**31-1.
PRODUCERS = {
    "kafka_python": {"producer_id": -1, "producer_epoch": -1, "base_sequence": -1, "transactional": False},
    "aiokafka": {"producer_id": 4242, "producer_epoch": 7, "base_sequence": 2**31 - 3, "transactional": True},
}


class _CramjamSnappy(types.SimpleNamespace):
    """The two calls kafka.codec makes on python-snappy, answered by cramjam."""

    @staticmethod
    def compress(data):
        return bytes(cramjam.snappy.compress_raw(bytes(data)))

    @staticmethod
    def decompress(data):
        return bytes(cramjam.snappy.decompress_raw(bytes(data)))


def build(builder_class, codec, producer):
    builder = builder_class(
        magic=2, compression_type=codec, is_transactional=int(producer["transactional"]),
        producer_id=producer["producer_id"], producer_epoch=producer["producer_epoch"],
        base_sequence=producer["base_sequence"], batch_size=1 << 20)
    for offset, timestamp, key, value, headers in RECORDS:
        assert builder.append(offset, timestamp, key, value, headers) is not None
    data = bytes(builder.build())
    assert data[22] & 7 == codec, f"{builder_class} sent codec {codec} uncompressed"  # attributes' low byte
    return data


def main():
    if kafka.codec.snappy is None:
        kafka.codec.snappy = _CramjamSnappy()
    clients = {
        "kafka_python": kafka_python_records.DefaultRecordBatchBuilder,
        "aiokafka": aiokafka_records.DefaultRecordBatchBuilder,
    }
    for client, builder_class in clients.items():
        for codec, name in CODECS.items():
            (HERE / f"{client}_{name}.bin").write_bytes(build(builder_class, codec, PRODUCERS[client]))
    golden_path = HERE / "golden.json"
    golden = json.loads(golden_path.read_text()) if golden_path.exists() else {}  # keeps capture_via_kop's part
    golden |= {
        "records": [
            {"offset_delta": o, "timestamp": t, "key": None if k is None else k.hex(),
             "value": None if v is None else v.hex(),
             "headers": [[hk, None if hv is None else hv.hex()] for hk, hv in h]}
            for o, t, k, v, h in RECORDS
        ],
        "producers": PRODUCERS,
    }
    golden_path.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
