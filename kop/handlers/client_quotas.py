"""DescribeClientQuotas (key 48) and AlterClientQuotas (key 49), v0-1 (v1 flexible). Version notes: an entity is one
or two (type, name) components, a null name meaning `<default>`; describe filters match a name exactly, the default,
or any (strict: the entity has no other component types). kop serves producer_byte_rate and consumer_byte_rate.
Describing needs DESCRIBE_CONFIGS on the cluster, altering ALTER_CONFIGS."""
from kafka.protocol.admin.client_quotas import (AlterClientQuotasRequest, AlterClientQuotasResponse,
                                                DescribeClientQuotasRequest, DescribeClientQuotasResponse)

from kop.handlers.context import RequestContext
from kop.security.acls import Operation
from kop.security.quotas import Entity, QuotaError
from protocol.errors import ErrorCode

EXACT, DEFAULT, ANY = 0, 1, 2


def _matches(entity: Entity, components, strict: bool) -> bool:
    names = dict(entity)
    for component in components:
        if component.entity_type not in names:
            return False
        name = names[component.entity_type]
        if component.match_type == EXACT and name != component.match:
            return False
        if component.match_type == DEFAULT and name is not None:
            return False
    return not strict or len(names) == len(components)


async def describe(ctx: RequestContext, request: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse:
    cls = DescribeClientQuotasResponse[ctx.version]
    if not ctx.authorized_on_cluster(Operation.DESCRIBE_CONFIGS):
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                   error_message="DESCRIBE_CONFIGS on the cluster is needed", entries=None)
    Entry = cls.EntryData
    entries = [Entry(entity=[Entry.EntityData(entity_type=kind, entity_name=name) for kind, name in entity],
                     values=[Entry.ValueData(key=key, value=value) for key, value in sorted(values.items())])
               for entity, values in ctx.quota_book.entries().items()
               if _matches(entity, request.components, request.strict)]
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, entries=entries)


async def alter(ctx: RequestContext, request: AlterClientQuotasRequest) -> AlterClientQuotasResponse:
    cls = AlterClientQuotasResponse[ctx.version]
    allowed = ctx.authorized_on_cluster(Operation.ALTER_CONFIGS)
    results = []
    for entry in request.entries:
        entity: Entity = tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity))
        error, message = ErrorCode.NONE, None
        if not allowed:
            error, message = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER_CONFIGS on the cluster is needed"
        else:
            try:
                await ctx.quota_book.alter(entity, {op.key: None if op.remove else op.value for op in entry.ops},
                                           validate_only=request.validate_only)
            except QuotaError as exc:
                error, message = ErrorCode.INVALID_REQUEST, str(exc)
            except OSError as exc:
                error, message = ErrorCode.UNKNOWN_SERVER_ERROR, f"not stored: {exc}"
        results.append(cls.EntryData(error_code=error, error_message=message, entity=[
            cls.EntryData.EntityData(entity_type=kind, entity_name=name) for kind, name in entity]))
    return cls(throttle_time_ms=0, entries=results)


ROUTES = [(DescribeClientQuotasRequest.API_KEY, 0, 1, describe), (AlterClientQuotasRequest.API_KEY, 0, 1, alter)]
