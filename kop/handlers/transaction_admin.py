"""What admin tools ask about transactions and producers (Kafka's `kafka-transactions.sh`, AdminClient's
listTransactions / describeTransactions / describeProducers). Version notes:

- ListTransactions (66) v0-1: filters by state and producer id; v1 adds the duration filter (transactions running
  longer than it). v2's transactional-id pattern is not served. In a cluster each broker lists the ids it
  coordinates (admin clients ask every broker, as with Kafka).
- DescribeTransactions (65) v0: each id's state, timeout, start, producer and partitions; an unknown id answers
  TRANSACTIONAL_ID_NOT_FOUND, one another broker coordinates NOT_COORDINATOR.
- DescribeProducers (61) v0 (KIP-664): per partition, every producer with durable state, idempotent or
  transactional: its epoch, last sequence and timestamp, and the first offset of its open transaction.
"""
from kafka.protocol.admin.transactions import (DescribeProducersRequest, DescribeProducersResponse,
                                               DescribeTransactionsRequest, DescribeTransactionsResponse,
                                               ListTransactionsRequest, ListTransactionsResponse)

from dedup.sequences import to_wire
from kop import clock
from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.transactions.state import TxnState
from protocol.errors import ErrorCode

STATES_BY_NAME = {state.kafka_name: state for state in TxnState}


async def list_transactions(ctx: RequestContext, request: ListTransactionsRequest) -> ListTransactionsResponse:
    cls = ListTransactionsResponse[ctx.version]
    wanted_states = {STATES_BY_NAME[name] for name in request.state_filters if name in STATES_BY_NAME}
    unknown = [name for name in request.state_filters if name not in STATES_BY_NAME]
    producer_ids = set(request.producer_id_filters)
    min_duration = request.duration_filter if ctx.version >= 1 else -1
    now = clock.now_ms()
    listed = []
    for meta in ctx.transactions.states.values():
        if request.state_filters and meta.state not in wanted_states:
            continue
        if producer_ids and meta.producer_id not in producer_ids:
            continue
        if min_duration >= 0 and not (meta.state is TxnState.ONGOING and now - meta.start_ms > min_duration):
            continue
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, meta.transactional_id):
            continue  # listed only to who may describe it, as in Kafka
        listed.append(cls.TransactionState(transactional_id=meta.transactional_id, producer_id=meta.producer_id,
                                           transaction_state=meta.state.kafka_name))
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, unknown_state_filters=unknown,
               transaction_states=sorted(listed, key=lambda s: s.transactional_id))


async def describe_transactions(ctx: RequestContext,
                                request: DescribeTransactionsRequest) -> DescribeTransactionsResponse:
    cls = DescribeTransactionsResponse[ctx.version]
    State = cls.TransactionState
    out = []
    for transactional_id in request.transactional_ids:
        meta = ctx.transactions.states.get(transactional_id)
        authorized = ctx.authorized(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        if meta is None or not authorized:
            error = (ctx.transactions.serves(transactional_id) or ErrorCode.TRANSACTIONAL_ID_NOT_FOUND) if authorized \
                else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED  # another broker's id: NOT_COORDINATOR
            out.append(State(error_code=error, transactional_id=transactional_id,
                             transaction_state="", transaction_timeout_ms=0, transaction_start_time_ms=-1,
                             producer_id=-1, producer_epoch=-1, topics=[]))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out.append(State(error_code=ErrorCode.NONE, transactional_id=transactional_id,
                         transaction_state=meta.state.kafka_name, transaction_timeout_ms=meta.timeout_ms,
                         transaction_start_time_ms=meta.start_ms, producer_id=meta.producer_id,
                         producer_epoch=meta.producer_epoch,
                         topics=[State.TopicData(topic=t, partitions=ps) for t, ps in by_topic.items()]))
    return cls(throttle_time_ms=0, transaction_states=out)


async def describe_producers(ctx: RequestContext, request: DescribeProducersRequest) -> DescribeProducersResponse:
    cls = DescribeProducersResponse[ctx.version]
    Topic = cls.TopicResponse
    Partition = Topic.PartitionResponse
    topics = []
    for wanted in request.topics:
        partitions = []
        for index in wanted.partition_indexes:
            partition = ctx.topics.partition(wanted.name, index)
            if not ctx.authorized(Operation.READ, ResourceType.TOPIC, wanted.name):
                partitions.append(Partition(partition_index=index, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                            error_message=None, active_producers=[]))
                continue
            if partition is None:
                partitions.append(Partition(partition_index=index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                            error_message=f"unknown partition {wanted.name}-{index}",
                                            active_producers=[]))
                continue
            open_transactions = partition.transactions.open
            producers = [
                Partition.ProducerState(
                    producer_id=producer_id, producer_epoch=state.epoch,
                    last_sequence=to_wire(state.batches[-1].last_seq) if state.batches else -1,
                    last_timestamp=state.batches[-1].timestamp if state.batches else -1, coordinator_epoch=-1,
                    current_txn_start_offset=open_transactions.get(producer_id, -1))
                for producer_id, state in sorted(partition.producers.persisted_state().items())]
            partitions.append(Partition(partition_index=index, error_code=ErrorCode.NONE, error_message=None,
                                        active_producers=producers))
        topics.append(Topic(name=wanted.name, partitions=partitions))
    return cls(throttle_time_ms=0, topics=topics)


ROUTES = [
    (ListTransactionsRequest.API_KEY, 0, 1, list_transactions),
    (DescribeTransactionsRequest.API_KEY, 0, 0, describe_transactions),
    (DescribeProducersRequest.API_KEY, 0, 0, describe_producers),
]
