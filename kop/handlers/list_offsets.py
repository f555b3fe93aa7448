"""ListOffsets (key 2). Version notes: served v1-v10 (v0 returns old-style offset arrays); v2+ isolation level; v4+
leader epoch; v8 earliest-local (-4), v9 latest-tiered (-5), v10 a timeout for remote lookups (KIP-1075), unused here.
Timestamp -2 = earliest, -1 = latest (the high watermark, = last offset + 1; read_committed: the last
stable offset), -3 = max timestamp (v7+, the first record holding the greatest timestamp), -4 = the log start (all of
kop's log is local), -5 = no tiered offset (-1 with epoch -1, as Kafka answers without remote storage); otherwise the first offset whose record timestamp is >= the
given one: per-ledger and per-batch max timestamps (kop/ledger/time_index.py) find the batch without reading older data,
its records the offset (as Kafka's time index and LogSegment.findOffsetByTimestamp do)."""
import logging

from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from kop.handlers.context import RequestContext
from kop.ledger import ManagedLedgerError
from kop.security.acls import Operation, ResourceType
from kop.partition import PartitionLog
from protocol.errors import ErrorCode
from protocol.records import iter_records

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5
SEARCHED = (EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL)  # the special values answered from the log
READ_COMMITTED = 1

log = logging.getLogger(__name__)


async def _by_timestamp(partition: PartitionLog, timestamp: int) -> tuple[int, int]:
    """(timestamp, offset) of the first record, in offset order, whose timestamp is >= `timestamp`. The ledger finds
    the batch from batch header max timestamps; only that batch is decoded. A batch straddling the log start may
    hold its match below it, then the search goes on after it."""
    start = partition.log_start_offset
    for _ in range(max(partition.high_watermark - start, 0)):  # each round passes at least one offset
        entry = await partition.ledger.find_by_timestamp(timestamp, start)
        if entry is None:
            break
        for record in iter_records(entry.data):
            if record.timestamp >= timestamp and record.offset >= partition.log_start_offset:
                return record.timestamp, record.offset
        start = entry.first_index + entry.span
    return -1, -1


async def _max_timestamp(partition: PartitionLog) -> tuple[int, int]:
    """(timestamp, offset) of the first record holding the greatest timestamp (KIP-734)."""
    greatest = await partition.ledger.max_timestamp(partition.log_start_offset)
    return await _by_timestamp(partition, greatest) if greatest >= 0 else (-1, -1)


async def _find(ctx: RequestContext, request: ListOffsetsRequest, partition: PartitionLog,
                timestamp: int) -> tuple[int, int]:
    """(timestamp, offset) answering `timestamp`: one of the special values above, or a time to search for."""
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, partition.log_start_offset
    if timestamp == LATEST:
        committed = ctx.version >= 2 and request.isolation_level == READ_COMMITTED
        return -1, partition.last_stable_offset if committed else partition.high_watermark
    if timestamp == MAX_TIMESTAMP:
        return await _max_timestamp(partition)
    return await _by_timestamp(partition, timestamp)


async def handle(ctx: RequestContext, request: ListOffsetsRequest) -> ListOffsetsResponse:
    cls = ListOffsetsResponse[ctx.version]
    topics_out = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            result = cls.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=p.partition_index, error_code=ErrorCode.NONE, timestamp=-1, offset=-1, leader_epoch=0)
            partition = ctx.topics.partition(topic.name, p.partition_index)
            if partition is not None and not ctx.cluster.serves_reads(topic.name, p.partition_index):
                partition = None  # moved, or this broker's view is too old to tell
            if not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif partition is None:
                result.error_code = ctx.topics.missing_partition_error(topic.name, p.partition_index)
            elif p.timestamp == LATEST_TIERED:
                result.leader_epoch = -1
            elif p.timestamp < 0 and p.timestamp not in SEARCHED:
                result.error_code = ErrorCode.INVALID_REQUEST
            else:
                try:
                    result.timestamp, result.offset = await _find(ctx, request, partition, p.timestamp)
                except (ManagedLedgerError, OSError) as exc:  # a read error, or out of descriptors: this partition
                    log.warning("list offsets of %s at %d failed: %s", partition.name, p.timestamp, exc,
                                extra=ctx.log_fields)
                    result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            parts.append(result)
        topics_out.append(cls.ListOffsetsTopicResponse(name=topic.name, partitions=parts))
    return cls(throttle_time_ms=0, topics=topics_out)


ROUTES = [(ListOffsetsRequest.API_KEY, 1, 10, handle)]
