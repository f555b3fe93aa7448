"""Authorization for APIs that act on the cluster as a whole (replica placement, log directories): one check before
the handler, answered with the API's top-level error code as Kafka answers it."""
from kop.handlers.context import RequestContext
from kop.handlers.registry import Handler
from kop.security.acls import Operation
from protocol.api import response_class
from protocol.errors import ErrorCode


def requires_cluster(operation: Operation, handler: Handler) -> Handler:
    async def guarded(ctx: RequestContext, request):
        if ctx.authorized_on_cluster(operation):
            return await handler(ctx, request)
        cls = response_class(ctx.header.api_key, ctx.version)
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    return guarded
