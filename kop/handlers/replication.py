"""ReplicateEntries (key 32000, kop's own, v0): entries a geo-replicator of another cluster sends, each judged by
its source position under the replicator's dedup name for the source topic's id (kop/partition.py
`publish_replicated`), so resends are stored once, and a source topic deleted and created again is stored in full,
after what its earlier incarnation left here. The topic is created, or grown to the source's partition count, on
first use. A request meant for another cluster, coming from this one, or from a cluster this one does not know, is
refused whole: a misconfigured cluster registry must not mix two clusters.

The ordered phase hands every entry to its partition in request order, so entries of one partition are appended in
the order the replicator sends them; a partition stops at its first refused entry (the replicator resends from it).

A PIP-33 snapshot REQUEST from a cluster this one does not replicate back to is answered in the response, with where
it was stored; sent again (its response lost), it is found stored and answered from where it was stored then."""
import asyncio
import functools
import logging
import uuid
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from kop.handlers.context import RequestContext
from kop.partition import AppendResult, source_position_key
from kop.security.acls import Operation
from kop.replication.snapshots import StoredRequests
from kop.topics import Topic, TopicError
from protocol.errors import ErrorCode
from protocol.records import RecordBatchError, marker_payload, split_batches
from protocol.replication import REPLICATE_ENTRIES_KEY, ReplicateEntriesRequest, ReplicateEntriesResponse
from proto.kop_pb2 import MarkerType, MessageMetadata, ReplicatedSubscriptionsSnapshotRequest

log = logging.getLogger(__name__)
Response = ReplicateEntriesResponse
Result = Response.ReplicateTopicResult.ReplicatePartitionResult
REQUEST = MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST


def _refused(ctx: RequestContext, message: str) -> Response:
    log.warning("replication request refused: %s", message, extra=ctx.log_fields)
    return Response[0](throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST, error_message=message, topics=[])


async def _topic(ctx: RequestContext, name: str, partitions: int) -> Topic:
    """The topic, created with (or grown to) the source's partition count."""
    topic = ctx.topics.get(name)
    if topic is None:
        try:
            topic = await ctx.topics.create(name, partitions, {})
            log.info("topic %s created for replication with %d partitions", name, partitions, extra=ctx.log_fields)
        except TopicError as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            topic = ctx.topics.get(name)
    if topic is not None and topic.count < partitions:
        try:
            await ctx.topics.add_partitions(name, partitions)
        except TopicError as exc:
            if exc.code != ErrorCode.INVALID_PARTITIONS:  # grown meanwhile by another request
                raise
    if topic is None:
        raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} was deleted meanwhile")
    return topic


def _failed(code: ErrorCode, message: str) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(AppendResult(code, message=message))
    return future


@dataclass(frozen=True, slots=True)
class Planned:
    """One entry handed to its partition: its future AppendResult, and for a PIP-33 snapshot REQUEST to answer in
    the response, (snapshot id, source ledger id, source entry id)."""

    future: asyncio.Future
    answer: tuple[str, int, int] | None = None
    partition: str = ""


def _publish(ctx: RequestContext, source: str, topic: Topic, topic_id: uuid.UUID, index: int, entries) -> list[Planned]:
    partition = topic.partition(index)
    if partition is None:
        return [Planned(_failed(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic.name}-{index}"))]
    # A cluster that replicates the topic back answers with a RESPONSE marker; one that does not, in the response.
    answers_here = source not in ctx.services.replication.remotes(topic.name)
    planned = []
    for entry in entries:
        try:
            metadata = MessageMetadata.FromString(entry.metadata)
            batches = split_batches(entry.records)
            if len(batches) != 1:
                raise RecordBatchError(ErrorCode.CORRUPT_MESSAGE, f"{len(batches)} record batches in one entry")
            header, view = batches[0]
            source_position_key(entry.ledger_id, entry.entry_id)  # in range, or ValueError
            snapshot_id = _snapshot_request(metadata, view) if answers_here else None
        except (RecordBatchError, DecodeError, ValueError) as exc:
            log.warning("replicated entry %d:%d for %s refused: %s", entry.ledger_id, entry.entry_id, partition.name,
                        exc, extra=ctx.log_fields)
            planned.append(Planned(_failed(ErrorCode.CORRUPT_MESSAGE, str(exc))))
            break
        future = partition.publish_replicated(source, topic_id, entry.ledger_id, entry.entry_id, metadata, header,
                                              view)
        answer = None
        if snapshot_id is not None:
            answer = (snapshot_id, entry.ledger_id, entry.entry_id)
            # Remembered once stored, whether or not the response still goes out.
            future.add_done_callback(functools.partial(_remember, ctx.services.replication.stored_requests,
                                                       partition.name, snapshot_id))
        planned.append(Planned(future, answer, partition.name))
        if future.done() and future.result().error:  # the rest would overtake it: the replicator resends them
            break
    return planned


def _remember(requests: StoredRequests, partition: str, snapshot_id: str, done: asyncio.Future) -> None:
    position = done.result().position
    if position is not None:
        requests.remember(partition, snapshot_id, position)


def _snapshot_request(metadata: MessageMetadata, view: memoryview) -> str | None:
    if metadata.marker_type != REQUEST:
        return None
    return ReplicatedSubscriptionsSnapshotRequest.FromString(marker_payload(view)[1]).snapshot_id


async def handle(ctx: RequestContext, request: ReplicateEntriesRequest):
    if not ctx.authorized_on_cluster(Operation.CLUSTER_ACTION):  # what Kafka's brokers need among themselves
        log.warning("replication request refused: %s lacks CLUSTER_ACTION on the cluster", ctx.session.principal,
                    extra=ctx.log_fields)
        return Response[0](throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                           error_message="replicating to this cluster needs CLUSTER_ACTION on it", topics=[])
    local, source = ctx.config.cluster_name, request.source_cluster
    if request.target_cluster != local:
        return _refused(ctx, f"this broker belongs to cluster {local!r}, not {request.target_cluster!r}: check the "
                             f"broker URL registered for {request.target_cluster!r} in cluster {source!r}")
    if source == local:
        return _refused(ctx, f"cluster {local!r} cannot replicate to itself")
    if ctx.services.replication.clusters.get(source) is None:
        return _refused(ctx, f"cluster {source!r} is not in this cluster's registry: register it here too "
                             f"(kop admin clusters create {source} --broker-url HOST:PORT)")
    planned = []
    for topic_data in request.topics:
        try:
            topic = await _topic(ctx, topic_data.name, topic_data.partition_count)
            refused = None
        except TopicError as exc:
            topic, refused = None, _failed(exc.code, str(exc))
        for pdata in topic_data.partitions:
            entries = [Planned(refused)] if topic is None else _publish(ctx, source, topic, topic_data.topic_id,
                                                                        pdata.partition_index, pdata.entries)
            planned.append((topic_data.name, pdata.partition_index, entries))
    return _respond(planned, ctx.services.replication.stored_requests)


async def _respond(planned, stored_requests: StoredRequests) -> Response:
    by_topic: dict[str, list] = {}
    for name, index, entries in planned:
        stored = duplicates = 0
        error, message = ErrorCode.NONE, None
        answers = []
        for entry in entries:
            outcome: AppendResult = await entry.future
            if outcome.error:
                error, message = outcome.error, outcome.message
                break
            stored += 1
            duplicates += outcome.duplicate
            if entry.answer is None:
                continue
            snapshot_id, source_ledger, source_entry = entry.answer
            position = stored_requests.position(entry.partition, snapshot_id) if outcome.duplicate else outcome.position
            if position is not None:  # a duplicate stored before this broker started is not known: not answered
                answers.append(Result.SnapshotAnswer(
                    snapshot_id=snapshot_id, source_ledger_id=source_ledger, source_entry_id=source_entry,
                    ledger_id=position.ledger_id, entry_id=position.entry_id))
        by_topic.setdefault(name, []).append(Result(
            partition_index=index, error_code=error, error_message=message, stored=stored, duplicates=duplicates,
            snapshot_answers=answers))
    topics = [Response.ReplicateTopicResult(name=name, partitions=partitions) for name, partitions in by_topic.items()]
    return Response[0](throttle_time_ms=0, error_code=ErrorCode.NONE, topics=topics)


ROUTES = [(REPLICATE_ENTRIES_KEY, 0, 0, handle)]
