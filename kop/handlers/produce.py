"""Produce (key 0). Version notes: v3+ only (record batch v2, magic 2), exactly one batch per partition as Kafka
requires; v8+ carries record_errors and error_message (we put the reason for a rejected batch there); v9+ flexible;
v11 allows KIP-890's TRANSACTION_ABORTABLE (kop never needs to answer it); v12 lets a producer of transaction
version 2 add partitions implicitly, which it does only when the broker advertises that feature (kop does not, so
producers add partitions with AddPartitionsToTxn); v13 names topics by id (an unknown id is UNKNOWN_TOPIC_ID).

The ordered phase (this function: it never waits, so the connection runs it inline, with no task) validates each
partition's batch and hands it to its PartitionLog, which assigns offsets in arrival order; the returned future
completes, by callbacks rather than a coroutine, once every partition's write is durable (or refused). acks=0 gets no
response, but the writes still happen. The request is decoded and the response encoded by hand
(`protocol.produce_request`, `protocol.produce_response`): every produce request pays for both. Each topic is looked
up once per request, and its configs come parsed (`Topic.settings`), so a batch pays for neither."""
import asyncio
import functools
import logging
from collections.abc import Callable

from kop import internal_topics
from kop.handlers.context import RequestContext
from kop.handlers.registry import Deferred
from kop.internal_topics import REFUSAL, REFUSED
from kop.ledger import ManagedLedgerError
from kop.security.acls import Operation, ResourceType
from kop.security.quotas import PRODUCE_RATE
from kop.partition import AppendResult, PartitionLog
from kop.topics import TopicSettings
from protocol.errors import ErrorCode
from protocol.produce_request import ProduceRequest
from protocol.produce_response import MAX_VERSION, MIN_VERSION, PartitionResponse, ProduceResponse
from protocol.sequence_headers import SequenceHeaderScan
from protocol.records import (BatchHeader, FalseMaxTimestamp, RecordBatchError, iter_records, set_max_timestamp,
                              split_batches, validate_batch)

log = logging.getLogger(__name__)


def _rejected(code: ErrorCode, message: str, record_errors: tuple[tuple[int, str], ...] = ()) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(AppendResult(code, message=message, record_errors=record_errors))
    return future


def _keyless_records(view: memoryview) -> tuple[tuple[int, str], ...]:
    return tuple((i, "Compacted topic cannot accept message without key")
                 for i, record in enumerate(iter_records(view)) if record.key is None)


def _with_max_timestamp(view: memoryview, timestamp_ms: int) -> tuple[BatchHeader, memoryview]:
    """A copy of the batch with its maxTimestamp set from its records, as Kafka's LogValidator does rather than
    refuse it (librdkafka writes maxTimestamp 0 for records timestamped -1). Only such batches pay for the copy."""
    buf = bytearray(view)
    set_max_timestamp(buf, 0, timestamp_ms)
    return split_batches(buf)[0]


def _publish_one(ctx: RequestContext, partition: PartitionLog, settings: TopicSettings,
                 records: bytes | memoryview | None, timeout_ms: int, transactional_id: str | None) -> asyncio.Future:
    if not records:
        return _rejected(ErrorCode.INVALID_RECORD, "no record batch")
    limit = settings.max_message_bytes
    try:
        batches = split_batches(records)
        if len(batches) != 1:
            raise RecordBatchError(ErrorCode.INVALID_RECORD,
                                   f"produce v3+ must carry exactly one record batch per partition, got {len(batches)}")
        header, view = batches[0]
        if header.size > limit:
            raise RecordBatchError(ErrorCode.MESSAGE_TOO_LARGE,
                                   f"batch of {header.size} bytes exceeds max.message.bytes {limit}")
        if header.is_control:
            raise RecordBatchError(ErrorCode.INVALID_RECORD, "clients may not produce control batches")
        verify = False
        if header.is_transactional and ctx.transactions.judges(transactional_id):
            refused = ctx.transactions.check_produce(header.producer_id, header.producer_epoch, partition.topic,
                                                     partition.partition)
            if refused is not None:
                log.warning("refused transactional batch for %s: producer %d epoch %d (%s)", partition.name,
                            header.producer_id, header.producer_epoch, refused.name, extra=ctx.log_fields)
                return _rejected(refused, "the partition is not in an open transaction of this producer and epoch")
        elif header.is_transactional:  # another broker coordinates it: asked unless its transaction is open here
            verify = header.producer_id in partition.verifying \
                or header.producer_id not in partition.transactions.open
        elif header.producer_id >= 0 and (ctx.transactions.in_open_transaction(header.producer_id)
                                          or header.producer_id in partition.transactions.open):
            return _rejected(ErrorCode.INVALID_TXN_STATE,
                             f"producer {header.producer_id} has a transaction open: its batches must be transactional")
        # A transaction's records are not judged by application sequence ids: an aborted one must not count as
        # stored (its retry must be stored), and a committed one is already exactly once.
        judged = partition.judges_sequence_headers() and not header.is_transactional
        watch = SequenceHeaderScan if judged else None
        try:
            records = validate_batch(header, view, watch=watch)
        except FalseMaxTimestamp as exc:
            header, view = _with_max_timestamp(view, exc.records_max)
            records = validate_batch(header, view, watch=watch)
        if settings.compacted and (keyless := _keyless_records(view)):
            # Kafka's rule for compacted topics: every record has a key (the cleaner keeps the latest per key).
            log.warning("rejected batch for %s: %d records without a key on a compacted topic", partition.name,
                        len(keyless), extra=ctx.log_fields)
            return _rejected(ErrorCode.INVALID_RECORD, "compacted topic cannot accept records without a key",
                             keyless)
    except RecordBatchError as exc:
        log.warning("rejected batch for %s: %s", partition.name, exc, extra=ctx.log_fields)
        return _rejected(exc.error_code, str(exc))
    ctx.metrics.observe_batch(header.size, header.records_count)
    if verify:
        return _publish_verified(ctx, partition, transactional_id, header,
                                 lambda: partition.publish_normal(header, view, timeout_ms, records, ctx.log_fields))
    return partition.publish_normal(header, view, timeout_ms, records, ctx.log_fields)


def _publish_verified(ctx: RequestContext, partition: PartitionLog, transactional_id: str | None, header: BatchHeader,
                      publish: Callable[[], asyncio.Future]) -> asyncio.Future:
    """A transactional batch whose transaction another broker coordinates, from a producer with no transaction open
    here: that coordinator is asked first whether the transaction is open and holds this partition (KIP-890's
    verification), so a batch that comes after its transaction ended cannot open one no one will end. The
    producer's later batches to this partition wait behind it, so their order holds."""
    producer_id = header.producer_id
    before = partition.verifying.get(producer_id)
    handed = asyncio.get_running_loop().create_future()
    partition.verifying[producer_id] = handed

    async def verified() -> asyncio.Future:
        if before is not None:
            await before
        if producer_id in partition.transactions.open:  # a batch before it, verified, opened the transaction
            return publish()
        markers = partition.markers_handed(producer_id)
        error = await ctx.transactions.verify_elsewhere(transactional_id, producer_id, header.producer_epoch,
                                                        (partition.topic, partition.partition))
        if error == ErrorCode.NONE and partition.markers_handed(producer_id) != markers:
            error = ErrorCode.INVALID_TXN_STATE  # its transaction ended while the coordinator was asked
        if error == ErrorCode.NONE:
            try:
                await partition.expect_transactions()
            except (ManagedLedgerError, OSError) as exc:
                return _rejected(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot record that it holds transactions: {exc}")
            return publish()
        log.warning("refused transactional batch for %s: producer %d epoch %d (%s from its coordinator)",
                    partition.name, producer_id, header.producer_epoch, error.name, extra=ctx.log_fields)
        return _rejected(error, "the transaction's coordinator did not find it open with this partition")

    async def run() -> AppendResult:
        try:
            written = await verified()
        finally:
            handed.set_result(None)
            if partition.verifying.get(producer_id) is handed:
                del partition.verifying[producer_id]
        return await written

    return asyncio.ensure_future(run())


# Per topic (its name, or its id's bytes from v13), each partition's index, PartitionLog (None if there is no such
# partition) and future AppendResult.
Outcomes = list[tuple[str | bytes, list[tuple[int, PartitionLog | None, asyncio.Future]]]]
TOPIC_IDS_FROM = 13


def _missing(ctx: RequestContext, name: str | None, index: int) -> asyncio.Future:
    if name is None:
        return _rejected(ErrorCode.UNKNOWN_TOPIC_ID, "unknown topic id")
    error = ctx.topics.missing_partition_error(name, index)
    if error == REFUSED:
        return _rejected(error, REFUSAL)
    if error == ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return _rejected(error, f"another broker leads {name}-{index}")
    return _rejected(error, f"unknown topic or partition {name}-{index}")


def _note_refused(ctx: RequestContext, name: str, index: int, records: bytes | memoryview) -> None:
    """An idempotent batch answered NOT_LEADER_OR_FOLLOWER here: told to the topics, in case this broker is taking
    the partition over (then the batches pipelined behind it must not overtake its resend)."""
    try:
        batches = split_batches(records)
    except RecordBatchError:
        return
    if len(batches) == 1:
        header = batches[0][0]
        if header.producer_id >= 0 and header.base_sequence >= 0 and not header.is_control:
            ctx.topics.refused_before_open(name, index, header.producer_id, header.producer_epoch,
                                           header.base_sequence, header.base_sequence + header.last_offset_delta)


def handle(ctx: RequestContext, request: ProduceRequest) -> ProduceResponse | Deferred | None:
    acks = request.acks
    results: Outcomes = []
    transactional_id = request.transactional_id
    transaction_refused = transactional_id is not None and not ctx.authorized(
        Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    by_id = ctx.version >= TOPIC_IDS_FROM
    produced = 0  # bytes, for the produce quota
    for topic_data in request.topic_data:
        if by_id:
            key = topic_data.topic_id.bytes  # type: ignore[union-attr]  (the zero id too: an unknown topic)
            name = ctx.topics.name_of(key) or internal_topics.name_of(key)
        else:
            key = name = topic_data.name
        topic = ctx.topics.get(name) if name is not None else None
        # an unknown topic id is answered UNKNOWN_TOPIC_ID below: there is no name to authorize
        writable = name is None or ctx.authorized(Operation.WRITE, ResourceType.TOPIC, name)
        per_partition = []
        for pdata in topic_data.partition_data:
            index = pdata.index
            partition = topic.partition(index) if topic is not None else None
            if acks not in (-1, 0, 1):
                future = _rejected(ErrorCode.INVALID_REQUIRED_ACKS, f"acks must be -1, 0 or 1, got {acks}")
            elif transaction_refused:
                future = _rejected(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                   f"{ctx.principal} may not write as transactional id {transactional_id}")
            elif not writable:
                future = _rejected(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{ctx.principal} may not write to {name}")
            elif topic is None or partition is None:
                future = _missing(ctx, name, index)
                if topic is not None and 0 <= index < topic.count and pdata.records:
                    _note_refused(ctx, name, index, pdata.records)
            else:
                future = _publish_one(ctx, partition, topic.settings, pdata.records, request.timeout_ms,
                                      transactional_id)
            per_partition.append((index, partition, future))
            if pdata.records is not None:
                produced += len(pdata.records)
        results.append((key, per_partition))
    throttle_ms = ctx.throttle(PRODUCE_RATE, produced)
    if acks == 0:
        return None
    return _respond(ctx, results, throttle_ms)


def _respond(ctx: RequestContext, results: Outcomes, throttle_ms: int) -> ProduceResponse | Deferred:
    """The response, or the response once every partition's outcome is known."""
    build = functools.partial(_response, ctx.version, results, throttle_ms)
    waiting = [future for _, per_partition in results for _, _, future in per_partition if not future.done()]
    if not waiting:
        return build()
    if len(waiting) == 1:  # the usual request: one batch
        return Deferred(waiting[0], build)
    all_done = asyncio.get_running_loop().create_future()
    left = len(waiting)

    def one_done(_future: asyncio.Future) -> None:
        nonlocal left
        left -= 1
        if not left and not all_done.done():
            all_done.set_result(None)

    for future in waiting:
        future.add_done_callback(one_done)
    return Deferred(all_done, build)


def _response(version: int, results: Outcomes, throttle_ms: int) -> ProduceResponse:
    topics = []
    for topic, per_partition in results:
        partitions = []
        for index, partition, future in per_partition:
            outcome: AppendResult = future.result()
            partitions.append(PartitionResponse(
                index, outcome.error, outcome.base_offset, outcome.log_append_time,
                partition.log_start_offset if partition else -1, outcome.record_errors,
                outcome.message if outcome.error else None))
        topics.append((topic, partitions))
    return ProduceResponse(version, topics, throttle_ms)


ROUTES = [(ProduceRequest.API_KEY, MIN_VERSION, MAX_VERSION, handle)]
