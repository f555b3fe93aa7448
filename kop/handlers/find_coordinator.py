"""FindCoordinator (key 10). Version notes: v1+ key type (0 group, 1 transaction) and an error message; v3+
flexible; v4+ a batch of coordinator keys with one answer each (KIP-699); v6 allows key type 2 (share groups),
which we refuse with INVALID_REQUEST.

One broker coordinates every group, so the answer is always this broker, or COORDINATOR_NOT_AVAILABLE until the
group coordinator has loaded. Transaction keys get this broker too: its transaction coordinator serves every
transactional id.
"""
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from kop.handlers.context import RequestContext
from protocol.errors import ErrorCode

GROUP_KEY, TRANSACTION_KEY = 0, 1


def _answer(ctx: RequestContext, key_type: int) -> tuple[ErrorCode, str | None]:
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        return ErrorCode.INVALID_REQUEST, f"unsupported coordinator key type {key_type}"
    if not ctx.groups.loaded:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group coordinator is loading"
    return ErrorCode.NONE, None


async def handle(ctx: RequestContext, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
    v = ctx.version
    cls = FindCoordinatorResponse[v]
    node, host, port = ctx.endpoint.node_id, ctx.endpoint.host, ctx.endpoint.port
    key_type = request.key_type if v >= 1 else GROUP_KEY
    error, message = _answer(ctx, key_type)
    if error != ErrorCode.NONE:
        node, host, port = -1, "", -1
    if v < 4:
        return cls(throttle_time_ms=0, error_code=error, error_message=message, node_id=node, host=host, port=port)
    return cls(throttle_time_ms=0, coordinators=[
        cls.Coordinator(key=key, node_id=node, host=host, port=port, error_code=error, error_message=message)
        for key in request.coordinator_keys])


ROUTES = [(FindCoordinatorRequest.API_KEY, 0, 6, handle)]
