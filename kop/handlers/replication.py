"""ReplicateEntries (key 32000, kop's own, v0): entries a geo-replicator of another cluster sends, each judged by
its source position under the replicator's dedup name for the source topic's id (kop/partition.py
`publish_replicated`), so resends are stored once, and a source topic deleted and created again is stored in full,
after what its earlier incarnation left here. The topic is created, or grown to the source's partition count, on
first use. A request meant for another cluster, coming from this one, or from a cluster this one does not know, is
refused whole: a misconfigured cluster registry must not mix two clusters.

The ordered phase hands every entry to its partition in request order, so entries of one partition are appended in
the order the replicator sends them; a partition stops at its first refused entry (the replicator resends from it).

A PIP-33 snapshot REQUEST from a cluster this one does not replicate back to is answered in the response, with where
it was stored; sent again (its response lost), it is found stored and answered from where it was stored then.

In a cluster of brokers the source reaches one of them (its registered address); the entries of a partition another
broker owns are handed on to that owner (kop/cluster/peers.py), once: a broker that gets them handed on and does not
own the partition either (the two saw ownership move at different times) answers NOT_LEADER_OR_FOLLOWER, and the
replicator sends them again."""
import asyncio
import functools
import logging
import uuid
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from kop.cluster.peers import PeerUnreachable
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
            if topic is not None and _owned_elsewhere(ctx, request, topic, pdata.partition_index):
                planned.append((topic_data.name, pdata.partition_index,
                                asyncio.ensure_future(_hand_on(ctx, request, topic_data, pdata))))
                continue
            entries = [Planned(refused)] if topic is None else _publish(ctx, source, topic, topic_data.topic_id,
                                                                        pdata.partition_index, pdata.entries)
            planned.append((topic_data.name, pdata.partition_index, entries))
    return _respond(planned, ctx.services.replication.stored_requests)


def _owned_elsewhere(ctx: RequestContext, request: ReplicateEntriesRequest, topic: Topic, index: int) -> bool:
    return (topic.partition(index) is None and not request.forwarded and 0 <= index < topic.count
            and ctx.topics.missing_partition_error(topic.name, index) == ErrorCode.NOT_LEADER_OR_FOLLOWER)


async def _hand_on(ctx: RequestContext, request: ReplicateEntriesRequest, topic_data, pdata) -> Result:
    """One partition's entries, sent to the broker of this cluster that owns it; its answer."""
    node = ctx.cluster.leader(topic_data.name, pdata.partition_index)
    handed = ReplicateEntriesRequest[0](
        source_cluster=request.source_cluster, target_cluster=request.target_cluster, timeout_ms=request.timeout_ms,
        forwarded=True, topics=[ReplicateEntriesRequest.ReplicateTopic(
            name=topic_data.name, topic_id=topic_data.topic_id, partition_count=topic_data.partition_count,
            partitions=[pdata])])
    try:
        answer = await ctx.cluster.call_peer(node, handed, ReplicateEntriesResponse)
    except PeerUnreachable as exc:
        return _not_stored(pdata.partition_index, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                           f"the owner of {topic_data.name}-{pdata.partition_index}, broker {node}, not reached: {exc}")
    if answer.error_code:
        return _not_stored(pdata.partition_index, ErrorCode(answer.error_code), answer.error_message)
    got = answer.topics[0].partitions[0]
    return Result(partition_index=pdata.partition_index, error_code=got.error_code, error_message=got.error_message,
                  stored=got.stored, duplicates=got.duplicates, snapshot_answers=[
                      Result.SnapshotAnswer(snapshot_id=a.snapshot_id, source_ledger_id=a.source_ledger_id,
                                            source_entry_id=a.source_entry_id, ledger_id=a.ledger_id,
                                            entry_id=a.entry_id) for a in got.snapshot_answers])


def _not_stored(index: int, error: ErrorCode, message: str | None) -> Result:
    return Result(partition_index=index, error_code=error, error_message=message, stored=0, duplicates=0,
                  snapshot_answers=[])


async def _respond(planned, stored_requests: StoredRequests) -> Response:
    by_topic: dict[str, list] = {}
    for name, index, entries in planned:
        if isinstance(entries, asyncio.Future):  # handed on to the partition's owner: its answer
            by_topic.setdefault(name, []).append(await entries)
            continue
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
