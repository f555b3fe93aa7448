"""FindCoordinator (key 10). Version notes: v1+ key type (0 group, 1 transaction) and an error message; v3+
flexible; v4+ a batch of coordinator keys with one answer each (KIP-699); v6 allows key type 2 (share groups),
which we refuse with INVALID_REQUEST.

One broker coordinates every group, so the answer is always this broker, or COORDINATOR_NOT_AVAILABLE until the
group coordinator has loaded. Transaction keys get this broker too: its transaction coordinator serves every
transactional id.
"""
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from protocol.errors import ErrorCode

GROUP_KEY, TRANSACTION_KEY = 0, 1


RESOURCES = {GROUP_KEY: (ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED),
             TRANSACTION_KEY: (ResourceType.TRANSACTIONAL_ID, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}


def _answer(ctx: RequestContext, key_type: int, key: str) -> tuple[ErrorCode, str | None]:
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        return ErrorCode.INVALID_REQUEST, f"unsupported coordinator key type {key_type}"
    resource_type, refusal = RESOURCES[key_type]
    if not ctx.authorized(Operation.DESCRIBE, resource_type, key):
        return refusal, f"{ctx.principal} may not describe {key}"
    if not ctx.groups.loaded:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group coordinator is loading"
    return ErrorCode.NONE, None


async def handle(ctx: RequestContext, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
    v = ctx.version
    cls = FindCoordinatorResponse[v]
    node, host, port = ctx.endpoint.node_id, ctx.endpoint.host, ctx.endpoint.port
    key_type = request.key_type if v >= 1 else GROUP_KEY
    if v < 4:
        error, message = _answer(ctx, key_type, request.key)
        if error != ErrorCode.NONE:
            node, host, port = -1, "", -1
        return cls(throttle_time_ms=0, error_code=error, error_message=message, node_id=node, host=host, port=port)
    coordinators = []
    for key in request.coordinator_keys:
        error, message = _answer(ctx, key_type, key)
        found = (node, host, port) if error == ErrorCode.NONE else (-1, "", -1)
        coordinators.append(cls.Coordinator(key=key, node_id=found[0], host=found[1], port=found[2], error_code=error,
                                            error_message=message))
    return cls(throttle_time_ms=0, coordinators=coordinators)


ROUTES = [(FindCoordinatorRequest.API_KEY, 0, 6, handle)]
