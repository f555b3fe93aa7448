"""InitProducerId (key 22). Version notes: v0-v2 carry only the transactional id and timeout (aiokafka sends v0);
v3+ add the current producer id and epoch (KIP-360) so a client can ask for an epoch bump after a fatal sequence
error; v4+ may be answered PRODUCER_FENCED.

Idempotent producers (no transactional id): without an id, or with one we never issued, a new producer id with epoch
0, taken from the durable block allocator (ids are never reused). With its current id and epoch (KIP-360): the same
id, epoch + 1 (a new id once the epoch would overflow); the dedup core then requires the new epoch to start at
sequence 0 and drops the old epoch's state."""
from protocol.api import response_class
from protocol.errors import ErrorCode

MAX_EPOCH = 32767


async def handle(ctx, request):
    cls = response_class(22, ctx.version)
    if request.transactional_id is not None:
        # Transactions are not served yet: refuse instead of handing out an id that could not be fenced.
        return cls(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                   producer_id=-1, producer_epoch=-1)
    allocator = ctx.broker.producer_ids
    pid = request.producer_id if ctx.version >= 3 else -1
    epoch = request.producer_epoch if ctx.version >= 3 else -1
    if pid >= 0 and allocator.was_issued(pid) and 0 <= epoch < MAX_EPOCH - 1:
        return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=epoch + 1)
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=allocator.allocate(), producer_epoch=0)


ROUTES = [(22, 0, 5, handle)]
