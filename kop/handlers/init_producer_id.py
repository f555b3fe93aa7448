"""InitProducerId (key 22). Version notes: v0-v2 carry only the transactional id and timeout (aiokafka sends v0);
v3+ add the current producer id and epoch (KIP-360) so a client can ask for an epoch bump after a fatal sequence
error (kafka-python does; Java and librdkafka bump idempotent epochs locally); v4+ may be answered PRODUCER_FENCED.

Idempotent producers (no transactional id). Kafka answers every request with a new producer id and epoch 0; kop does
too, except for a KIP-360 bump it can prove safe: the (id, epoch) presented is the one kop last handed out for that
id (`ProducerIdAllocator.bump`), and no partition has seen that id with a higher epoch (Java and librdkafka bump
locally, so a higher epoch may be live without kop having issued it). Then the answer is the same id, epoch + 1, and
the dedup core requires the new epoch to start at sequence 0 and drops the old epoch's state. A stale pair (a retry
after a lost response, a zombie) or an unknown one (never issued, forgotten after a restart) gets a new id, never
the next epoch of a producer that may be alive. Clients adopt whatever comes back.

Transactional producers: the transaction coordinator answers (kop/transactions/coordinator.py): the id's producer id
with its epoch bumped, fencing the previous holder; PRODUCER_FENCED reaches versions before v4 as
INVALID_PRODUCER_EPOCH."""
import logging

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.handlers.transactions import fencing_for_version
from kop.topics import TopicManager
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)
FIRST_FENCED_VERSION = 4  # InitProducerId may answer PRODUCER_FENCED from v4 on


def _higher_epoch_in_use(topics: TopicManager, producer_id: int, epoch: int) -> bool:
    for partition in topics.all_partitions():
        current = partition.producers.epoch(producer_id)
        if current is not None and current > epoch:
            return True
    return False


def _may_init(ctx: RequestContext, transactional_id: str | None) -> bool:
    """WRITE on the transactional id; an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some
    topic (Kafka's rule since 2.8)."""
    if transactional_id is not None:
        return ctx.authorized(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    return ctx.authorized_on_cluster(Operation.IDEMPOTENT_WRITE) or ctx.authorizer.allows_some(
        ctx.principal, ctx.client_host, Operation.WRITE, ResourceType.TOPIC)


async def handle(ctx: RequestContext, request: InitProducerIdRequest) -> InitProducerIdResponse:
    cls = InitProducerIdResponse[ctx.version]
    pid = request.producer_id if ctx.version >= 3 else -1
    epoch = request.producer_epoch if ctx.version >= 3 else -1
    if request.transactional_id == "":  # Kafka's answer: an id that names no one
        return cls(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST, producer_id=-1, producer_epoch=-1)
    if not _may_init(ctx, request.transactional_id):
        error = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED if request.transactional_id is None
                 else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        return cls(throttle_time_ms=0, error_code=error, producer_id=-1, producer_epoch=-1)
    if request.transactional_id is not None:
        error, pid, epoch = await ctx.transactions.init_producer_id(
            request.transactional_id, request.transaction_timeout_ms, pid, epoch)
        return cls(throttle_time_ms=0, error_code=fencing_for_version(error, ctx.version, FIRST_FENCED_VERSION),
                   producer_id=pid, producer_epoch=epoch)
    allocator = ctx.producer_ids
    if pid >= 0 and epoch >= 0 and not _higher_epoch_in_use(ctx.topics, pid, epoch):
        bumped = allocator.bump(pid, epoch)
        if bumped is not None:
            log.info("producer %d: epoch %d bumped to %d (KIP-360)", pid, epoch, bumped, extra=ctx.log_fields)
            return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=bumped)
    fresh = await allocator.allocate()
    if pid >= 0:
        log.info("producer %d epoch %d is not the current epoch kop issued for it: new producer id %d", pid, epoch,
                 fresh, extra=ctx.log_fields)
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=fresh, producer_epoch=0)


ROUTES = [(InitProducerIdRequest.API_KEY, 0, 5, handle)]
