"""ApiVersions (key 18). Version notes: v3+ is flexible and carries client software name/version; the response
header is never flexible. The list is derived from the router, so only served APIs are advertised."""
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from kop.handlers.context import RequestContext
from protocol.errors import ErrorCode


async def handle(ctx: RequestContext, request: ApiVersionsRequest) -> ApiVersionsResponse:
    cls = ApiVersionsResponse[ctx.version]
    keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(ctx.api_versions.items())]
    return cls(error_code=ErrorCode.NONE, api_keys=keys, throttle_time_ms=0)


ROUTES = [(ApiVersionsRequest.API_KEY, 0, 4, handle)]
