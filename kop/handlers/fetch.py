"""Fetch (key 1). Version notes: served v4-v18. v4+ isolation level, last stable offset and aborted transactions; v5+
log start offset; v7+ fetch sessions (KIP-227: kop/fetch_sessions.py keeps them; incremental fetches name and
answer only what changed); v11+ rack id (ignored); v13+ topics by id (an unknown id is UNKNOWN_TOPIC_ID); v15+
replica state, v16+ node endpoints, v17+ replica directory id, v18+ the follower's high watermark (KIP-1166): all
for followers, which a single broker never has. At least one batch is returned even if it exceeds the byte limits
(KIP-74), so a consumer always makes progress.

Long poll: answer at once when min_bytes are available, max_wait_ms is 0, or any partition has an error
(UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE, ...: as Kafka does, so the client learns of it without waiting);
otherwise wait until new entries become durable on any partition read or max_wait_ms passes. A fetch that would
answer nothing only because the engine's entry cache missed (PostgreSQL) first reads those entries back, even with
max_wait_ms 0: stored records are available to read, as Kafka's are on disk."""
import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from kafka.protocol.consumer import FetchRequest

from kop import internal_topics
from kop.fetch_sessions import (INVALID_SESSION_ID, FetchPlan, Groups, PartitionKey, TopicKey, Wanted, outdated,
                                plan_fetch)
from kop.handlers.context import RequestContext
from kop.ledger import Entry, ManagedLedgerError
from kop.partition import PartitionLog
from kop.security.acls import Operation, ResourceType
from kop.security.quotas import FETCH_RATE
from protocol.api import id_bytes
from protocol.errors import ErrorCode
from protocol.fetch_response import AbortedTransaction, FetchableTopicResponse, FetchResponse, PartitionData

MIN_WAIT_SLICE = 0.001
READ_BACK_WAIT_S = 5.0  # at most this long for a read-back an answer waits on; then it goes as it is
READ_COMMITTED = 1
FIRST_SESSION_VERSION = 7
FIRST_TOPIC_ID_VERSION = 13

log = logging.getLogger(__name__)


# A session's partition with nothing to read and nothing new to tell (an incremental answer leaves it out): one
# shared object in place of its answer, so an idle partition costs none.
UNCHANGED: Any = object()


@dataclass(slots=True)
class Collected:
    """One pass over the partitions wanted: the answer of each (PartitionData, in order, or UNCHANGED), the bytes of batches read, the partitions found (which a long poll watches) and what each serves,
    counted once the answer goes."""

    answers: list[Any] = field(default_factory=list)
    total: int = 0
    errors: int = 0  # partitions answered an error
    partitions: list[PartitionLog] = field(default_factory=list)
    served: list[tuple[PartitionLog, int]] = field(default_factory=list)
    # read_committed answers with batches from a partition with aborted transactions indexed, to list them in:
    # (answer, partition, first entry returned, fetch offset, end of the batches returned)
    aborted_wanted: list[tuple[Any, PartitionLog, Entry, int, int]] = field(default_factory=list)
    # partitions whose read came back empty below what may be read (the entry cache missed), with the fetch offset
    short: list[tuple[PartitionLog, int]] = field(default_factory=list)

    def ready(self, min_bytes: int) -> bool:
        return self.total >= min_bytes or self.errors > 0


def _plan(ctx: RequestContext, request: FetchRequest) -> FetchPlan:
    by_id = ctx.version >= FIRST_TOPIC_ID_VERSION
    named: Groups = [(_topic_key(t, by_id), t.partitions) for t in request.topics]
    if ctx.version < FIRST_SESSION_VERSION:
        return FetchPlan("sessionless", named)
    forgotten: list[PartitionKey] = [(_topic_key(t, by_id), p) for t in request.forgotten_topics_data or ()
                                     for p in t.partitions]
    return plan_fetch(ctx.services.fetch_sessions, request.session_id, request.session_epoch, by_id, named, forgotten)


def _topic_key(topic: Any, by_id: bool) -> TopicKey:
    return id_bytes(topic.topic_id) if by_id else topic.topic


def _topic_name(ctx: RequestContext, key: TopicKey) -> str | None:
    if isinstance(key, str):
        return key
    return ctx.topics.name_of(key) or internal_topics.name_of(key)


def _collect(ctx: RequestContext, request: FetchRequest, plan: FetchPlan) -> Collected:
    """Read what is available now. read_committed reads stop at the last stable offset and list the aborted
    transactions among the batches returned (the consumer drops their batches; _list_aborted fills them in);
    control batches go to every consumer, which skips them, as from Kafka. An incremental fetch's partitions are the
    session's, which remember what they were told: one at its end whose watermarks have not moved is UNCHANGED, and
    is neither read nor answered."""
    read_committed = request.isolation_level == READ_COMMITTED
    incremental = plan.kind == "incremental"
    budget = request.max_bytes
    out = Collected()
    answers = out.answers
    for key, partitions in plan.groups:
        name = _topic_name(ctx, key)
        if name is not None and not ctx.authorized(Operation.READ, ResourceType.TOPIC, name):
            answers.extend(PartitionData(w.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED) for w in partitions)
            out.errors += len(partitions)
            continue
        topic = ctx.topics.topics.get(name) if name is not None else None
        for w in partitions:
            partition = topic.partition(w.partition) if topic is not None else None
            if partition is not None and not ctx.cluster.serves_reads(name, w.partition):
                partition = None  # moved, or this broker's view is too old to tell: NOT_LEADER_OR_FOLLOWER
            if partition is None:
                answers.append(PartitionData(w.partition, ctx.topics.missing_partition_error(name, w.partition)
                                             if name is not None else ErrorCode.UNKNOWN_TOPIC_ID))
                out.errors += 1
                continue
            out.partitions.append(partition)
            hw = partition.high_watermark
            log_start = partition.log_start_offset
            offset = w.fetch_offset
            if incremental and offset == hw == w.high_watermark and log_start == w.log_start_offset:
                answers.append(UNCHANGED)
                continue
            lso = partition.last_stable_offset
            data = PartitionData(w.partition, ErrorCode.NONE, hw, lso, log_start)
            answers.append(data)
            if offset < log_start or offset > hw:
                data.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                out.errors += 1
                continue
            if read_committed:
                data.aborted_transactions = []
            end = lso if read_committed else hw
            limit = min(w.partition_max_bytes, budget - out.total)
            if offset >= end or (limit <= 0 and out.total > 0):
                continue
            try:
                # Only the answer's first batch may exceed the limits (KIP-74), so a consumer stuck on a large
                # batch progresses; later partitions get whole batches that fit, or nothing.
                entries = partition.read_records(offset, max(limit, 1), whole_first=out.total == 0)
            except OSError as exc:  # a read error, or out of descriptors: this partition fails, not the request
                log.warning("fetch from %s at %d failed: %s", partition.name, offset, exc, extra=ctx.log_fields)
                data.error_code, data.aborted_transactions = ErrorCode.KAFKA_STORAGE_ERROR, None
                out.errors += 1
                continue
            if not entries:
                out.short.append((partition, offset))
            if read_committed and entries and entries[-1].first_index >= end:
                entries = [e for e in entries if e.first_index < end]  # from the last stable offset on: not yet
            if entries:
                # the batches as read, never joined: the response writes them as they are
                data.records = [e.data for e in entries]
                size = data.records_size = sum([len(e.data) for e in entries])
                out.total += size
                out.served.append((partition, size))
                if read_committed and partition.transactions.indexes.holds_any:
                    out.aborted_wanted.append((data, partition, entries[0], offset,
                                               entries[-1].first_index + entries[-1].span))
    return out


async def _list_aborted(ctx: RequestContext, collected: Collected) -> None:
    """List the aborted transactions in the read_committed answers that want them: the one await of a fetch, as
    the stored indexes of closed ledgers may be read for it. A partition whose index cannot be read is answered
    KAFKA_STORAGE_ERROR, without its batches."""
    for data, partition, first, offset, upper in collected.aborted_wanted:
        try:
            aborted = await partition.aborted_transactions(first, offset, upper)
        except (ManagedLedgerError, OSError) as exc:
            log.warning("fetch from %s at %d: aborted-transaction index unreadable: %s", partition.name, offset, exc,
                        extra=ctx.log_fields)
            collected.served.remove((partition, data.records_size))
            collected.total -= data.records_size
            collected.errors += 1
            data.error_code, data.aborted_transactions, data.records, data.records_size = (
                ErrorCode.KAFKA_STORAGE_ERROR, None, (), 0)
            continue
        data.aborted_transactions = [AbortedTransaction(producer_id, first_offset)
                                     for producer_id, first_offset in aborted]
    collected.aborted_wanted = []


def _answer(ctx: RequestContext, plan: FetchPlan, collected: Collected) -> FetchResponse:
    """The response: every partition read, or for an incremental fetch those with something new; a full fetch's
    session is made here, remembering what each partition was told, and an incremental one's record of it updated."""
    cache = ctx.services.fetch_sessions
    if plan.kind == "error" or outdated(plan):
        error = plan.error if plan.kind == "error" else ErrorCode.INVALID_FETCH_SESSION_EPOCH
        session_id = plan.session.id if plan.session is not None else INVALID_SESSION_ID
        return FetchResponse(ctx.version, error_code=error, session_id=session_id)
    by_id = ctx.version >= FIRST_TOPIC_ID_VERSION
    session = plan.session
    # A full fetch's partitions become a session when the cache admits it (decided before they are built).
    remembered: dict[PartitionKey, Wanted] | None = {} if plan.kind == "full" and cache.admits(plan.size) else None
    answers = iter(collected.answers)
    topics: list[Any] = []
    for key, partitions in plan.groups:
        if session is None and remembered is None:
            parts = list(islice(answers, len(partitions)))
        else:
            parts = []
            for w, data in zip(partitions, answers):
                if session is not None:  # incremental: w is the session's Wanted
                    if data is UNCHANGED or not w.must_answer(bool(data.records), data.error_code,
                                                              data.high_watermark, data.log_start_offset):
                        continue
                    if data.records:
                        session.served_records(w)
                else:
                    wanted = remembered[(key, w.partition)] = Wanted(key, w.partition, w.fetch_offset,
                                                                     w.partition_max_bytes)
                    wanted.must_answer(False, data.error_code, data.high_watermark, data.log_start_offset)
                parts.append(data)
        if parts:
            topics.append(FetchableTopicResponse(uuid.UUID(bytes=key) if by_id else key, parts))
    if session is not None:
        session_id = session.id
    elif remembered is not None:
        session_id = cache.add(plan.uses_topic_ids, remembered)
    else:
        session_id = INVALID_SESSION_ID
    for partition, size in collected.served:
        partition.bytes_out += size
    throttle_ms = ctx.throttle(FETCH_RATE, sum(size for _partition, size in collected.served))
    return FetchResponse(ctx.version, throttle_ms, ErrorCode.NONE, session_id, topics)


async def handle(ctx: RequestContext, request: FetchRequest) -> FetchResponse | Awaitable[FetchResponse]:
    plan = _plan(ctx, request)
    if plan.kind == "error":
        return _answer(ctx, plan, Collected())
    collected = _collect(ctx, request, plan)
    if request.max_wait_ms <= 0 and not collected.total and collected.short:
        await _read_back(collected.short)
        collected = _collect(ctx, request, plan)
    if request.max_wait_ms <= 0 or collected.ready(request.min_bytes):
        if collected.aborted_wanted:
            await _list_aborted(ctx, collected)
        return _answer(ctx, plan, collected)
    return _long_poll(ctx, request, plan, collected)


async def _read_back(short: list[tuple[PartitionLog, int]]) -> None:
    """Wait (a bounded while) until the first entry each short read wants is held again. A read that fails is
    answered by the next collection, which meets the same failure."""
    reads = [partition.ledger.read_from_index_async(offset, 1, 1) for partition, offset in short]
    try:
        await asyncio.wait_for(asyncio.gather(*reads, return_exceptions=True), READ_BACK_WAIT_S)
    except asyncio.TimeoutError:
        log.warning("fetch: reading %d partitions back took over %.0f s; answered without them", len(short),
                    READ_BACK_WAIT_S)


async def _long_poll(ctx: RequestContext, request: FetchRequest, plan: FetchPlan,
                     collected: Collected) -> FetchResponse:
    deadline = time.monotonic() + request.max_wait_ms / 1000
    partitions = collected.partitions
    loop = asyncio.get_running_loop()
    while not collected.ready(request.min_bytes):
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
        collected = _collect(ctx, request, plan)
    if collected.aborted_wanted:
        await _list_aborted(ctx, collected)
    return _answer(ctx, plan, collected)


ROUTES = [(FetchRequest.API_KEY, 4, 18, handle)]
