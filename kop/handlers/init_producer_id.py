"""InitProducerId (key 22). Version notes: v0-v2 carry only the transactional id and timeout (aiokafka sends v0);
v3+ add the current producer id and epoch (KIP-360) so a client can ask for a bump; v4+ may get PRODUCER_FENCED.
For idempotent producers (no transactional id) Kafka hands out a new producer id with epoch 0, whatever the request
carries, and so do we. Ids come from a durable block allocator and are never reused."""
from protocol.api import response_class
from protocol.errors import ErrorCode


async def handle(ctx, request):
    cls = response_class(22, ctx.version)
    if request.transactional_id is not None:
        # Transactions are not served yet: say so instead of handing out an id that could not be fenced.
        return cls(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                   producer_id=-1, producer_epoch=-1)
    producer_id = ctx.broker.producer_ids.allocate()
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=0)


ROUTES = [(22, 0, 5, handle)]
