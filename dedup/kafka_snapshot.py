"""How a snapshot stores Kafka producer state: each producer's recent batches, packed into one string property.

A partition can hold tens of thousands of producers, five batches each. One property per batch (the older format,
still read) cost a formatted key each and a protobuf message each, on the event loop, at every snapshot; packed, the
whole state is one list of numbers: a format number, then per producer its id, its epoch, its batch count and six
numbers per batch (epoch, first and last sequence, base and last offset, timestamp), as protobuf varints
(`KafkaProducerState`), in base64 (string properties are UTF-8). The producer's epoch is its own field since a
transaction marker can raise it with no batch of that epoch yet (format 1 had no such field: the epoch was its
batches').
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence

from google.protobuf.message import DecodeError

from proto.kop_pb2 import KafkaProducerState

log = logging.getLogger(__name__)

STATE_KEY = "kop.kafka.producers"
FORMAT = 2
FORMAT_WITHOUT_EPOCH = 1  # still read
BATCH_FIELDS = 6  # epoch, first_seq, last_seq, base_offset, last_offset, timestamp
# The older format: "__kafka_batch:{pid}:{epoch}:{firstSeq}:{lastSeq}:{lastOffset}:{timestamp}" -> baseOffset.
LEGACY_KEY_PREFIX = "__kafka_batch:"

Batch = tuple[int, int, int, int, int, int]  # the fields above, in that order


def pack(producers: Iterable[tuple[int, int, Sequence[Batch]]]) -> dict[str, str]:
    """The string properties holding `(producer id, its epoch, its batches)` for every producer given."""
    numbers = [FORMAT]
    for producer_id, epoch, batches in producers:
        numbers += (producer_id, epoch, len(batches))
        for batch in batches:
            numbers += batch
    state = KafkaProducerState(numbers=numbers)
    return {STATE_KEY: base64.b64encode(state.SerializeToString()).decode("ascii")}


def unpack(strings: Mapping[str, str],
           properties: Mapping[str, int]) -> Iterator[tuple[int, int, list[Batch]]]:
    """(producer id, its epoch, its batches in sequence order) of every producer a snapshot holds, in any format."""
    yield from _legacy(properties)
    encoded = strings.get(STATE_KEY)
    if not encoded:
        return
    state = KafkaProducerState()
    try:
        state.ParseFromString(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError, DecodeError):
        log.warning("ignoring a malformed Kafka producer state in a dedup snapshot")
        return
    packed = list(state.numbers)
    if not packed or packed[0] not in (FORMAT, FORMAT_WITHOUT_EPOCH):
        log.warning("ignoring a Kafka producer state of unknown format %s", packed[0] if packed else None)
        return
    with_epoch = packed[0] == FORMAT
    head = 3 if with_epoch else 2  # id, (epoch,) batch count
    at, end = 1, len(packed)
    while at + head <= end:
        producer_id, count = packed[at], packed[at + head - 1]
        epoch = packed[at + 1] if with_epoch else None
        at += head
        if count < 0 or at + count * BATCH_FIELDS > end or (epoch is None and count == 0):
            log.warning("ignoring a truncated Kafka producer state in a dedup snapshot")
            return
        batches = [tuple(packed[i:i + BATCH_FIELDS]) for i in range(at, at + count * BATCH_FIELDS, BATCH_FIELDS)]
        yield producer_id, max(b[0] for b in batches) if epoch is None else epoch, batches
        at += count * BATCH_FIELDS


def _legacy(properties: Mapping[str, int]) -> Iterator[tuple[int, int, list[Batch]]]:
    by_producer: dict[int, list[Batch]] = {}
    for key, base_offset in properties.items():
        if not key.startswith(LEGACY_KEY_PREFIX):
            continue
        try:
            pid, epoch, first, last, last_offset, timestamp = map(int, key[len(LEGACY_KEY_PREFIX):].split(":"))
        except ValueError:
            log.warning("ignoring malformed dedup snapshot key %r", key)
            continue
        by_producer.setdefault(pid, []).append((epoch, first, last, base_offset, last_offset, timestamp))
    for pid, batches in by_producer.items():
        yield pid, max(b[0] for b in batches), sorted(batches, key=lambda b: b[1])
