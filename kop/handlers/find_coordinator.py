"""FindCoordinator (key 10). Version notes: v1+ key type (0 group, 1 transaction) and an error message; v3+
flexible; v4+ a batch of coordinator keys with one answer each (KIP-699); v6 allows key type 2 (share groups),
which we refuse with INVALID_REQUEST.

A group is coordinated by the owner of its `__consumer_offsets` shard (kop/cluster/groups.py): this broker alone on
the file engine, the shard's owner in a cluster; COORDINATOR_NOT_AVAILABLE until the group coordinator has loaded or
while no broker is live. A transactional id likewise by the owner of its transaction state log shard
(kop/cluster/transactions.py).
"""
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from kop.cluster import transactions
from kop.cluster.groups import shard_of
from kop.handlers.context import RequestContext
from kop.handlers.metadata import endpoints
from kop.internal_topics import CONSUMER_OFFSETS
from kop.security.acls import Operation, ResourceType
from protocol.errors import ErrorCode

GROUP_KEY, TRANSACTION_KEY = 0, 1


RESOURCES = {GROUP_KEY: (ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED),
             TRANSACTION_KEY: (ResourceType.TRANSACTIONAL_ID, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}


NOWHERE = (-1, "", -1)


def _answer(ctx: RequestContext, key_type: int, key: str) -> tuple[ErrorCode, str | None, tuple[int, str, int]]:
    """The error, its message and the coordinator (node id, host, port)."""
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        return ErrorCode.INVALID_REQUEST, f"unsupported coordinator key type {key_type}", NOWHERE
    resource_type, refusal = RESOURCES[key_type]
    if not ctx.authorized(Operation.DESCRIBE, resource_type, key):
        return refusal, f"{ctx.principal} may not describe {key}", NOWHERE
    if not ctx.groups.loaded:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group coordinator is loading", NOWHERE
    if key_type == TRANSACTION_KEY:
        node = ctx.cluster.leader(transactions.SHARD_TOPIC, transactions.shard_of(key))
    else:
        node = ctx.cluster.leader(CONSUMER_OFFSETS, shard_of(key))
    address = endpoints(ctx).get(node)
    if address is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, "no live broker coordinates it", NOWHERE
    return ErrorCode.NONE, None, (node, *address)


async def handle(ctx: RequestContext, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
    v = ctx.version
    cls = FindCoordinatorResponse[v]
    key_type = request.key_type if v >= 1 else GROUP_KEY
    if v < 4:
        error, message, (node, host, port) = _answer(ctx, key_type, request.key)
        return cls(throttle_time_ms=0, error_code=error, error_message=message, node_id=node, host=host, port=port)
    coordinators = []
    for key in request.coordinator_keys:
        error, message, (node, host, port) = _answer(ctx, key_type, key)
        coordinators.append(cls.Coordinator(key=key, node_id=node, host=host, port=port, error_code=error,
                                            error_message=message))
    return cls(throttle_time_ms=0, coordinators=coordinators)


ROUTES = [(FindCoordinatorRequest.API_KEY, 0, 6, handle)]
