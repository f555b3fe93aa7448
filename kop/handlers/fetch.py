"""Fetch (key 1). Version notes: served v4-v18. v4+ isolation level, last stable offset and aborted transactions; v5+
log start offset; v7+ fetch sessions, which we decline by answering session id 0 (clients then keep sending full
fetches); v11+ rack id (ignored); v13+ topics by id (an unknown id is UNKNOWN_TOPIC_ID); v15+ replica state, v16+
node endpoints, v17+ replica directory id, v18+ the follower's high watermark (KIP-1166): all for followers, which
a single broker never has. At least one batch
is returned even if it exceeds the byte limits (KIP-74), so a consumer always makes progress.

Long poll: answer at once when min_bytes are available, max_wait_ms is 0, or any partition has an error
(UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE, ...: as Kafka does, so the client learns of it without waiting);
otherwise wait until new entries become durable on any requested partition or max_wait_ms passes."""
import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse

from kop import internal_topics
from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.security.quotas import FETCH_RATE
from kop.ledger import Entry, ManagedLedgerError
from kop.partition import PartitionLog
from protocol.errors import ErrorCode

MIN_WAIT_SLICE = 0.001
READ_COMMITTED = 1


def _topic_name(ctx: RequestContext, ftopic: Any) -> str | None:
    if ctx.version < 13:
        return ftopic.topic
    return ctx.topics.name_of(ftopic.topic_id.bytes) or internal_topics.name_of(ftopic.topic_id.bytes)


# What a response serves: each partition read and the bytes of batches it gives, counted once the response goes.
Served = list[tuple[PartitionLog, int]]

log = logging.getLogger(__name__)


async def _collect(ctx: RequestContext, request: FetchRequest) -> tuple[list[Any], int, Served]:
    """Read what is available now; returns (per-topic partition results, total bytes, what each partition serves).
    read_committed reads stop at the last stable offset and list the aborted transactions among the batches
    returned (the consumer drops their batches; the indexes of closed ledgers may be read for it, the one
    await); control batches go to every consumer, which skips them, as from Kafka."""
    cls = FetchResponse[ctx.version]
    AbortedTransaction = cls.FetchableTopicResponse.PartitionData.AbortedTransaction
    topics = ctx.topics
    budget = request.max_bytes if ctx.version >= 3 else 0x7FFFFFFF
    total = 0
    out = []
    served: Served = []
    for ftopic in request.topics:
        parts = []
        name = _topic_name(ctx, ftopic)
        readable = name is None or ctx.authorized(Operation.READ, ResourceType.TOPIC, name)
        for fpart in ftopic.partitions:
            partition = topics.partition(name, fpart.partition) if name is not None else None
            data = cls.FetchableTopicResponse.PartitionData(
                partition_index=fpart.partition, error_code=ErrorCode.NONE, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, aborted_transactions=None, records=b"")
            if not readable:
                data.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(data)
                continue
            if partition is None:
                data.error_code = topics.missing_partition_error(name, fpart.partition) if name is not None \
                    else ErrorCode.UNKNOWN_TOPIC_ID
                parts.append(data)
                continue
            hw = partition.high_watermark
            lso = partition.last_stable_offset
            read_committed = request.isolation_level == READ_COMMITTED
            data.high_watermark = hw
            data.last_stable_offset = lso
            data.log_start_offset = partition.log_start_offset
            offset = fpart.fetch_offset
            if offset < partition.log_start_offset or offset > hw:
                data.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                parts.append(data)
                continue
            end = lso if read_committed else hw
            limit = min(fpart.partition_max_bytes, budget - total)
            if offset < end and (limit > 0 or total == 0):
                try:
                    entries = partition.read(offset, max(limit, 1))
                except OSError as exc:  # a read error, or out of descriptors: this partition fails, not the request
                    log.warning("fetch from %s at %d failed: %s", partition.name, offset, exc, extra=ctx.log_fields)
                    data.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                    parts.append(data)
                    continue
                if total > 0:
                    # Only the response's first batch may exceed the limits (KIP-74), so a consumer stuck on a
                    # large batch progresses; later partitions get whole batches that fit, or nothing.
                    entries = _fitting(entries, limit)
                # Markers (PIP-33) cover no offset and are never served: span 0.
                entries = [e for e in entries if e.span and (not read_committed or e.first_index < end)]
                if read_committed and entries and partition.transactions.indexes.holds_any:
                    try:
                        aborted = await partition.aborted_transactions(
                            entries[0], offset, entries[-1].first_index + entries[-1].span)
                    except (ManagedLedgerError, OSError) as exc:  # a damaged or unreadable index: as a read error
                        log.warning("fetch from %s at %d: aborted-transaction index not read: %s", partition.name,
                                    offset, exc, extra=ctx.log_fields)
                        data.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                        parts.append(data)
                        continue
                    data.aborted_transactions = [AbortedTransaction(producer_id=producer_id, first_offset=first)
                                                 for producer_id, first in aborted]
                if entries:
                    records = b"".join(e.data for e in entries)
                    data.records = records
                    total += len(records)
                    served.append((partition, len(records)))
            if read_committed and data.aborted_transactions is None:
                data.aborted_transactions = []
            parts.append(data)
        if ctx.version >= 13:
            out.append(cls.FetchableTopicResponse(topic_id=ftopic.topic_id, partitions=parts))
        else:
            out.append(cls.FetchableTopicResponse(topic=ftopic.topic, partitions=parts))
    return out, total, served


def _fitting(entries: list[Entry], limit: int) -> list[Entry]:
    size = 0
    for i, entry in enumerate(entries):
        size += len(entry.data)
        if size > limit:
            return entries[:i]
    return entries


def _ready(request: FetchRequest, topics: Sequence[Any], total: int) -> bool:
    return total >= request.min_bytes or any(p.error_code for t in topics for p in t.partitions)


def _response(ctx: RequestContext, topics: list[Any], served: Served) -> FetchResponse:
    for partition, size in served:
        partition.bytes_out += size
    cls = FetchResponse[ctx.version]
    throttle_ms = ctx.throttle(FETCH_RATE, sum(size for _partition, size in served))
    return cls(throttle_time_ms=throttle_ms, error_code=ErrorCode.NONE, session_id=0, responses=topics)


async def handle(ctx: RequestContext, request: FetchRequest) -> FetchResponse | Awaitable[FetchResponse]:
    if ctx.version >= 7 and request.session_id != 0:
        cls = FetchResponse[ctx.version]
        return cls(throttle_time_ms=0, error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    topics, total, served = await _collect(ctx, request)
    if request.max_wait_ms <= 0 or _ready(request, topics, total):
        return _response(ctx, topics, served)
    return _long_poll(ctx, request, topics, total, served)


async def _long_poll(ctx: RequestContext, request: FetchRequest, topics: list[Any], total: int,
                     served: Served) -> FetchResponse:
    deadline = time.monotonic() + request.max_wait_ms / 1000
    partitions = [p for t in request.topics if (name := _topic_name(ctx, t)) is not None
                  and ctx.authorized(Operation.READ, ResourceType.TOPIC, name) for fp in t.partitions
                  if (p := ctx.topics.partition(name, fp.partition)) is not None]
    loop = asyncio.get_running_loop()
    while not _ready(request, topics, total):
        remaining = deadline - time.monotonic()
        if remaining <= MIN_WAIT_SLICE:
            break
        woken = loop.create_future()
        for p in partitions:
            p.watch(woken)
        try:
            await asyncio.wait_for(woken, remaining)
        except asyncio.TimeoutError:
            break
        finally:
            for p in partitions:
                p.unwatch(woken)
        topics, total, served = await _collect(ctx, request)
    return _response(ctx, topics, served)


ROUTES = [(FetchRequest.API_KEY, 4, 18, handle)]
