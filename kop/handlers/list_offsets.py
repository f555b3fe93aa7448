"""ListOffsets (key 2). Version notes: served v1-v7 (v0 returns old-style offset arrays); v2+ isolation level; v4+
leader epoch. Timestamp -2 = earliest, -1 = latest (the high watermark, = last offset + 1), -3 = max timestamp
(v7+); otherwise the first offset whose record timestamp is >= the given one: batch max timestamps find the batch,
its records the offset (as Kafka's LogSegment.findOffsetByTimestamp)."""
import struct

from protocol.api import response_class
from protocol.errors import ErrorCode
from protocol.records import iter_records

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
_TIMES = struct.Struct(">qq")  # firstTimestamp, maxTimestamp at byte 27 of a v2 batch
SCAN_BYTES = 4 * 1024 * 1024


def _batches(partition, start: int):
    """(entry, last offset, max timestamp) of each durable batch from offset start on."""
    offset = start
    while offset < partition.high_watermark:
        entries = partition.read(offset, SCAN_BYTES)
        if not entries:
            return
        for e in entries:
            _first_ts, max_ts = _TIMES.unpack_from(e.data, 27)
            yield e, e.first_index + e.span - 1, max_ts
        offset = entries[-1].first_index + entries[-1].span


def _by_timestamp(partition, timestamp: int) -> tuple[int, int]:
    for entry, _last, max_ts in _batches(partition, partition.log_start_offset):
        if max_ts >= timestamp:
            for record in iter_records(entry.data):
                if record.timestamp >= timestamp and record.offset >= partition.log_start_offset:
                    return record.timestamp, record.offset
    return -1, -1


def _max_timestamp(partition) -> tuple[int, int]:
    best = (-1, -1)
    for _entry, last, max_ts in _batches(partition, partition.log_start_offset):
        if max_ts > best[0]:
            best = (max_ts, last)
    return best


async def handle(ctx, request):
    cls = response_class(2, ctx.version)
    topics_out = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            result = cls.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=p.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=0)
            partition = ctx.broker.topics.partition(topic.name, p.partition_index)
            if partition is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif p.timestamp == EARLIEST:
                result.offset = partition.log_start_offset
            elif p.timestamp == LATEST:
                result.offset = partition.high_watermark
            elif p.timestamp == MAX_TIMESTAMP:
                result.timestamp, result.offset = _max_timestamp(partition)
            elif p.timestamp < 0:
                result.error_code = ErrorCode.INVALID_REQUEST
            else:
                result.timestamp, result.offset = _by_timestamp(partition, p.timestamp)
            parts.append(result)
        topics_out.append(cls.ListOffsetsTopicResponse(name=topic.name, partitions=parts))
    return cls(throttle_time_ms=0, topics=topics_out)


ROUTES = [(2, 1, 7, handle)]
