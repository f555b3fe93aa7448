"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37), DeleteRecords (21). Version notes: CreateTopics v5+
returns the partition count and configs; DeleteTopics v6 names topics in `topics` (by name or id), v0-5 in
`topic_names`; replication factor must be -1 or 1 on a single broker, and a manual assignment may name only this
broker; ValidateOnly checks without creating. DeleteRecords moves a partition's log start offset (offset -1: the high
watermark); the records below it are gone for every reader at once, their ledgers are deleted later."""
import logging
import uuid
from collections.abc import Sequence

from kafka.protocol.admin import (CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
                                  CreateTopicsResponse, DeleteRecordsRequest, DeleteRecordsResponse,
                                  DeleteTopicsRequest, DeleteTopicsResponse)

from kop.handlers.configs import DEFAULT_CONFIG
from kop.handlers.context import RequestContext
from kop.internal_topics import missing_partition_error
from kop.ledger import LedgerClosedError, LedgerFencedOut, ManagedLedgerError
from kop.security.acls import Operation, ResourceType
from kop.topics import TOPIC_CONFIG_DEFAULTS, TopicError, unknown_topic
from protocol.api import id_bytes
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


def _require(ctx: RequestContext, operation: Operation, topic: str) -> None:
    if not ctx.authorized(operation, ResourceType.TOPIC, topic):
        raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{ctx.principal} may not {operation.name} {topic}")


async def create_topics(ctx: RequestContext, request: CreateTopicsRequest) -> CreateTopicsResponse:
    cls = CreateTopicsResponse[ctx.version]
    results = []
    for item in request.topics:
        configs = {c.name: c.value for c in item.configs if c.value is not None}
        result = cls.CreatableTopicResult(name=item.name, error_code=ErrorCode.NONE, error_message=None)
        try:
            if not (ctx.authorized_on_cluster(Operation.CREATE)
                    or ctx.authorized(Operation.CREATE, ResourceType.TOPIC, item.name)):
                raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{ctx.principal} may not create {item.name}")
            num_partitions = item.num_partitions
            if item.assignments:
                if item.num_partitions != -1 or item.replication_factor != -1:
                    raise TopicError(ErrorCode.INVALID_REQUEST, "both numPartitions or replicationFactor and "
                                     "replicasAssignments were set; give one or the other")
                indexes = sorted(a.partition_index for a in item.assignments)
                if indexes != list(range(len(indexes))):
                    raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     f"partitions must be numbered 0..{len(indexes) - 1}, got {indexes}")
                _check_replicas(ctx, [a.broker_ids for a in item.assignments])
                num_partitions = len(indexes)
            elif item.replication_factor not in (-1, 1):
                raise TopicError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                 f"replication factor {item.replication_factor} > 1 broker")
            if request.validate_only:
                partitions = ctx.topics.check_create(item.name, num_partitions, configs)
                topic_id = uuid.UUID(int=0)
            else:
                topic = await ctx.topics.create(item.name, num_partitions, configs)
                partitions = topic.count
                topic_id = uuid.UUID(bytes=topic.topic_id)
            result.topic_id = topic_id
            result.num_partitions = partitions
            result.replication_factor = 1
            result.configs = [
                cls.CreatableTopicResult.CreatableTopicConfigs(
                    name=k, value=configs.get(k, v), read_only=False, config_source=DEFAULT_CONFIG, is_sensitive=False)
                for k, v in TOPIC_CONFIG_DEFAULTS.items() if configs.get(k, v) is not None]
        except TopicError as exc:
            result.error_code, result.error_message = exc.code, str(exc)
        results.append(result)
    return cls(throttle_time_ms=0, topics=results)


def _check_replicas(ctx: RequestContext, replica_lists: Sequence[Sequence[int]]) -> None:
    """A manual assignment is valid when every partition names exactly this broker (a single broker's only choice)."""
    node = ctx.endpoint.node_id
    for replicas in replica_lists:
        if list(replicas) != [node]:
            raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"replicas {list(replicas)}: this cluster has one broker, id {node}")


async def delete_topics(ctx: RequestContext, request: DeleteTopicsRequest) -> DeleteTopicsResponse:
    cls = DeleteTopicsResponse[ctx.version]
    topics = ctx.topics
    if ctx.version >= 6:
        wanted = []
        for t in request.topics:
            name = t.name
            if name is None:
                match = next((x for x in topics.topics.values() if x.topic_id == id_bytes(t.topic_id)), None)
                name = match.name if match else None
            wanted.append((name, t.topic_id, t.name is None))
    else:
        wanted = [(name, None, False) for name in request.topic_names]
    results = []
    for name, topic_id, by_id in wanted:
        result = cls.DeletableTopicResult(name=name, error_code=ErrorCode.NONE)
        if topic_id is not None:
            result.topic_id = topic_id
        try:
            if name is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_ID, "unknown topic id")
            if by_id and not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, name):
                result.name = None  # named by its id: a principal that may not describe it is not told its name
                raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{ctx.principal} may not delete that topic")
            _require(ctx, Operation.DELETE, name)
            await topics.delete(name)
        except TopicError as exc:
            result.error_code = exc.code
            if ctx.version >= 5:
                result.error_message = str(exc)
        results.append(result)
    return cls(throttle_time_ms=0, responses=results)


async def create_partitions(ctx: RequestContext, request: CreatePartitionsRequest) -> CreatePartitionsResponse:
    cls = CreatePartitionsResponse[ctx.version]
    results = []
    for item in request.topics:
        result = cls.CreatePartitionsTopicResult(name=item.name, error_code=ErrorCode.NONE, error_message=None)
        try:
            _require(ctx, Operation.ALTER, item.name)
            topic = ctx.topics.get(item.name)
            if topic is None:
                raise unknown_topic(item.name)
            if item.count <= topic.count:
                raise TopicError(ErrorCode.INVALID_PARTITIONS,
                                 f"topic has {topic.count} partitions; {item.count} is not more")
            if item.assignments is not None:
                added = item.count - topic.count
                if len(item.assignments) != added:
                    raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     f"{len(item.assignments)} assignments for {added} new partitions")
                _check_replicas(ctx, [a.broker_ids for a in item.assignments])
            if not request.validate_only:
                await ctx.topics.add_partitions(item.name, item.count)
        except TopicError as exc:
            result.error_code, result.error_message = exc.code, str(exc)
        results.append(result)
    return cls(throttle_time_ms=0, results=results)


async def delete_records(ctx: RequestContext, request: DeleteRecordsRequest) -> DeleteRecordsResponse:
    cls = DeleteRecordsResponse[ctx.version]
    Result = cls.DeleteRecordsTopicResult
    topics = []
    for item in request.topics:
        partitions = []
        for p in item.partitions:
            result = Result.DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1,
                                                         error_code=ErrorCode.NONE)
            partition = ctx.topics.partition(item.name, p.partition_index)
            if not ctx.authorized(Operation.DELETE, ResourceType.TOPIC, item.name):
                result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif partition is None:
                result.error_code = missing_partition_error(item.name)
            else:
                offset = partition.high_watermark if p.offset == -1 else p.offset
                if not 0 <= offset <= partition.high_watermark:
                    result.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    try:
                        result.low_watermark = await partition.ledger.delete_before(offset)
                    except (LedgerClosedError, LedgerFencedOut):  # moved away or going: the client asks again
                        result.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    except (ManagedLedgerError, OSError) as exc:  # not recorded: nothing is deleted
                        log.warning("delete records of %s before %d failed: %s", partition.name, offset, exc,
                                    extra=ctx.log_fields)
                        result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            partitions.append(result)
        topics.append(Result(name=item.name, partitions=partitions))
    return cls(throttle_time_ms=0, topics=topics)


ROUTES = [
    (CreateTopicsRequest.API_KEY, 0, 7, create_topics),
    (DeleteRecordsRequest.API_KEY, 0, 2, delete_records),
    (DeleteTopicsRequest.API_KEY, 0, 6, delete_topics),
    (CreatePartitionsRequest.API_KEY, 0, 3, create_partitions),
]
