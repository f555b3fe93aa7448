"""The transactional producer's requests to its coordinator. Version notes:

- AddPartitionsToTxn (24) v0-3: v1 same as v0, v2 may answer PRODUCER_FENCED, v3 flexible. v4+ batch many
  transactional ids for brokers verifying on behalf of a producer (KIP-890 part 1): not served, kop verifies inside
  the produce path instead.
- AddOffsetsToTxn (25) v0-3, EndTxn (26) v0-3: v2 may answer PRODUCER_FENCED, v3 flexible. v4+ add
  TRANSACTION_ABORTABLE and v5 the epoch bump on every EndTxn (KIP-890 part 2): not served.
- TxnOffsetCommit (28) v0-3: v2 leader epochs, v3 flexible with the consumer's generation, member and instance id
  (KIP-447), which are checked against the group when a generation is given.

Before v2 of AddPartitionsToTxn/AddOffsetsToTxn/EndTxn (and v4 of InitProducerId) a fenced producer is told
INVALID_PRODUCER_EPOCH: the clients of that time do not know PRODUCER_FENCED.
"""
from kafka.protocol.producer.transaction import (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse,
                                                 AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
                                                 EndTxnResponse, TxnOffsetCommitRequest, TxnOffsetCommitResponse)

from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.handlers.groups import may_read_group
from kop.transactions.state import PendingOffset
from protocol.errors import ErrorCode

FIRST_VERSION_WITH_PRODUCER_FENCED = 2


def fencing_for_version(error: ErrorCode, version: int, first_fenced_version: int) -> ErrorCode:
    """PRODUCER_FENCED as the request version knows it (KIP-588: older versions get INVALID_PRODUCER_EPOCH)."""
    if error == ErrorCode.PRODUCER_FENCED and version < first_fenced_version:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


def _refused(ctx: RequestContext, transactional_id: str) -> ErrorCode | None:
    if ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return None
    return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def add_partitions(ctx: RequestContext, request: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse:
    v = ctx.version
    cls = AddPartitionsToTxnResponse[v]
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    refused = _refused(ctx, request.v3_and_below_transactional_id)
    unwritable = {name for name, _ in wanted if not ctx.authorized(Operation.WRITE, ResourceType.TOPIC, name)}
    if refused or unwritable:  # Kafka adds none of them then; the others get OPERATION_NOT_ATTEMPTED
        results = {(name, p): refused or (ErrorCode.TOPIC_AUTHORIZATION_FAILED if name in unwritable
                                          else ErrorCode.OPERATION_NOT_ATTEMPTED) for name, p in wanted}
    else:
        results = await ctx.transactions.add_partitions(request.v3_and_below_transactional_id,
                                                         request.v3_and_below_producer_id,
                                                         request.v3_and_below_producer_epoch, wanted)
    by_topic: dict[str, list] = {}
    Topic = cls.AddPartitionsToTxnTopicResult
    for (topic, partition), error in results.items():
        by_topic.setdefault(topic, []).append(Topic.AddPartitionsToTxnPartitionResult(
            partition_index=partition,
            partition_error_code=fencing_for_version(error, v, FIRST_VERSION_WITH_PRODUCER_FENCED)))
    return cls(throttle_time_ms=0, results_by_topic_v3_and_below=[
        Topic(name=name, results_by_partition=partitions) for name, partitions in by_topic.items()])


async def add_offsets(ctx: RequestContext, request: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse:
    error = _refused(ctx, request.transactional_id) or (
        None if may_read_group(ctx, request.group_id) else ErrorCode.GROUP_AUTHORIZATION_FAILED) or \
        await ctx.transactions.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                           request.group_id)
    return AddOffsetsToTxnResponse[ctx.version](
        throttle_time_ms=0, error_code=fencing_for_version(error, ctx.version, FIRST_VERSION_WITH_PRODUCER_FENCED))


async def end_txn(ctx: RequestContext, request: EndTxnRequest) -> EndTxnResponse:
    error = _refused(ctx, request.transactional_id) or await ctx.transactions.end_txn(
        request.transactional_id, request.producer_id, request.producer_epoch, request.committed)
    return EndTxnResponse[ctx.version](
        throttle_time_ms=0, error_code=fencing_for_version(error, ctx.version, FIRST_VERSION_WITH_PRODUCER_FENCED))


async def txn_offset_commit(ctx: RequestContext, request: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse:
    v = ctx.version
    cls = TxnOffsetCommitResponse[v]
    offsets = {(t.name, p.partition_index): PendingOffset(p.committed_offset,
                                                          p.committed_leader_epoch if v >= 2 else -1,
                                                          p.committed_metadata or "")
               for t in request.topics for p in t.partitions}
    error = _refused(ctx, request.transactional_id) or (
        None if may_read_group(ctx, request.group_id) else ErrorCode.GROUP_AUTHORIZATION_FAILED) or \
        ctx.groups.check(request.group_id)
    if error is None and v >= 3 and request.generation_id >= 0:
        error = ctx.groups.validate_commit(request.group_id, request.generation_id, request.member_id,
                                           request.group_instance_id)
    if error is None or error == ErrorCode.NONE:
        results = await ctx.transactions.txn_offset_commit(request.transactional_id, request.group_id,
                                                           request.producer_id, request.producer_epoch, offsets)
    else:
        results = {tp: error for tp in offsets}
    by_topic: dict[str, list] = {}
    Topic = cls.TxnOffsetCommitResponseTopic
    for (topic, partition), code in results.items():
        by_topic.setdefault(topic, []).append(Topic.TxnOffsetCommitResponsePartition(partition_index=partition,
                                                                                       error_code=code))
    return cls(throttle_time_ms=0, topics=[Topic(name=name, partitions=partitions)
                                           for name, partitions in by_topic.items()])


ROUTES = [
    (AddPartitionsToTxnRequest.API_KEY, 0, 3, add_partitions),
    (AddOffsetsToTxnRequest.API_KEY, 0, 3, add_offsets),
    (EndTxnRequest.API_KEY, 0, 3, end_txn),
    (TxnOffsetCommitRequest.API_KEY, 0, 3, txn_offset_commit),
]
