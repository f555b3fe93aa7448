"""The transactional producer's requests to its coordinator. Version notes:

- AddPartitionsToTxn (24) v0-3: v1 same as v0, v2 may answer PRODUCER_FENCED, v3 flexible. v4 batches many
  transactional ids for brokers verifying on behalf of a producer (KIP-890 part 1): served for verification only
  (a partition owner asks before it stores a transaction's first batch), to principals with CLUSTER_ACTION; v5
  (adding partitions on the producer's behalf, KIP-890 part 2) is not.
- AddOffsetsToTxn (25) v0-3, EndTxn (26) v0-3: v2 may answer PRODUCER_FENCED, v3 flexible. v4+ add
  TRANSACTION_ABORTABLE and v5 the epoch bump on every EndTxn (KIP-890 part 2): not served.
- TxnOffsetCommit (28) v0-3: v2 leader epochs, v3 flexible with the consumer's generation, member and instance id
  (KIP-447), which are checked against the group when a generation is given. Clients send it to the group's
  coordinator; kop keeps a transaction's offsets with its transaction coordinator, so in a cluster the group's
  coordinator checks the group and hands the request on to the transaction's coordinator (which accepts it for a
  group it does not coordinate only without a generation to check), and the offsets come back to the group's
  coordinator when the transaction commits (CommitTxnOffsets, kop's own request).
- WriteTxnMarkers (27) v1-2: a cluster's transaction coordinator writes its markers to the partitions other brokers
  own through them; CLUSTER_ACTION, as in Kafka. v2's transaction version is ignored (kop's markers are version 0).

Before v2 of AddPartitionsToTxn/AddOffsetsToTxn/EndTxn (and v4 of InitProducerId) a fenced producer is told
INVALID_PRODUCER_EPOCH: the clients of that time do not know PRODUCER_FENCED.
"""
from kafka.protocol.producer.transaction import (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse,
                                                 AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
                                                 EndTxnResponse, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
                                                 WriteTxnMarkersRequest, WriteTxnMarkersResponse)

from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.handlers.groups import may_read_group
from kop.transactions.state import PendingOffset
from protocol.errors import ErrorCode
from protocol.txn_offsets import COMMIT_TXN_OFFSETS_KEY, CommitTxnOffsetsRequest, CommitTxnOffsetsResponse

FIRST_VERSION_WITH_PRODUCER_FENCED = 2
VERIFYING_VERSION = 4


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
    if v >= VERIFYING_VERSION:
        return _verify(ctx, request, cls)
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


def _verify(ctx: RequestContext, request: AddPartitionsToTxnRequest, cls) -> AddPartitionsToTxnResponse:
    """A broker asks whether each partition is in its producer's open transaction (KIP-890's verification)."""
    Txn, Topic = cls.AddPartitionsToTxnResult, cls.AddPartitionsToTxnTopicResult
    if not ctx.authorized_on_cluster(Operation.CLUSTER_ACTION):
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results_by_transaction=[])
    answers = []
    for txn in request.transactions:
        wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
        if txn.verify_only:
            results = ctx.transactions.verify(txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted)
        else:  # adding on a producer's behalf is KIP-890 part 2, which kop does not serve
            results = {tp: ErrorCode.INVALID_REQUEST for tp in wanted}
        by_topic: dict[str, list] = {}
        for (topic, partition), error in results.items():
            by_topic.setdefault(topic, []).append(Topic.AddPartitionsToTxnPartitionResult(
                partition_index=partition, partition_error_code=error))
        answers.append(Txn(transactional_id=txn.transactional_id, topic_results=[
            Topic(name=name, results_by_partition=partitions) for name, partitions in by_topic.items()]))
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, results_by_transaction=answers)


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
    generation = request.generation_id if v >= 3 else -1
    error = _refused(ctx, request.transactional_id) or (
        None if may_read_group(ctx, request.group_id) else ErrorCode.GROUP_AUTHORIZATION_FAILED) or \
        ctx.groups.check(request.group_id)
    if error == ErrorCode.NOT_COORDINATOR and generation < 0 and ctx.transactions.serves(request.transactional_id) \
            is None:
        error = None  # handed on by the group's coordinator (it checked the group), or nothing to check there
    elif error is None and generation >= 0:
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


async def write_markers(ctx: RequestContext, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
    cls = WriteTxnMarkersResponse[ctx.version]
    Marker = cls.WritableTxnMarkerResult
    Topic = Marker.WritableTxnMarkerTopicResult
    allowed = ctx.authorized_on_cluster(Operation.CLUSTER_ACTION)
    answers = []
    for marker in request.markers:
        written = [(t.name, p, _write_marker(ctx, marker, t.name, p) if allowed else None)
                   for t in marker.topics for p in t.partition_indexes]
        by_topic: dict[str, list] = {}
        for topic, partition, future in written:
            error = ErrorCode.CLUSTER_AUTHORIZATION_FAILED if future is None else await future
            by_topic.setdefault(topic, []).append(Topic.WritableTxnMarkerPartitionResult(partition_index=partition,
                                                                                          error_code=error))
        answers.append(Marker(producer_id=marker.producer_id, topics=[
            Topic(name=name, partitions=partitions) for name, partitions in by_topic.items()]))
    return cls(markers=answers)


async def _write_marker(ctx: RequestContext, marker, topic: str, index: int) -> ErrorCode:
    partition = ctx.topics.partition(topic, index)
    if partition is None:
        return ctx.topics.missing_partition_error(topic, index)
    result = await partition.publish_control(marker.producer_id, marker.producer_epoch, marker.transaction_result,
                                             marker.coordinator_epoch)
    return result.error


async def commit_txn_offsets(ctx: RequestContext, request: CommitTxnOffsetsRequest) -> CommitTxnOffsetsResponse:
    """A transaction coordinator hands over the offsets a committed transaction committed for a group here."""
    cls = CommitTxnOffsetsResponse[ctx.version]
    Topic = cls.CommitTxnOffsetsTopicResult
    allowed = ctx.authorized_on_cluster(Operation.CLUSTER_ACTION)
    error = ctx.groups.check(request.group_id) if allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    if error is not None:
        return cls(throttle_time_ms=0, error_code=error, topics=[])
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            code = await ctx.groups.commit(request.group_id, t.name, p.partition_index, p.committed_offset,
                                           p.committed_leader_epoch, p.committed_metadata, p.commit_timestamp,
                                           keep_newer=p.commit_timestamp >= 0)
            partitions.append(Topic.CommitTxnOffsetsPartitionResult(partition_index=p.partition_index,
                                                                    error_code=code))
        topics.append(Topic(name=t.name, partitions=partitions))
    if request.committed:
        ctx.transactions.transaction_ended(request.group_id, request.producer_id,
                                           [(t.name, p.partition_index) for t in topics for p in t.partitions
                                            if p.error_code == ErrorCode.NONE])
    else:
        ctx.transactions.transaction_ended(request.group_id, request.producer_id)
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, topics=topics)


ROUTES = [
    (AddPartitionsToTxnRequest.API_KEY, 0, 4, add_partitions),
    (WriteTxnMarkersRequest.API_KEY, 1, 2, write_markers),
    (COMMIT_TXN_OFFSETS_KEY, 0, 0, commit_txn_offsets),
    (AddOffsetsToTxnRequest.API_KEY, 0, 3, add_offsets),
    (EndTxnRequest.API_KEY, 0, 3, end_txn),
    (TxnOffsetCommitRequest.API_KEY, 0, 3, txn_offset_commit),
]
