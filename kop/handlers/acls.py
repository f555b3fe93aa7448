"""CreateAcls (key 30), DescribeAcls (key 29), DeleteAcls (key 31), v1-3 (v2+ flexible). Version notes: v1 added the
pattern type; kop serves what kafka-python's schemas define. Creating and deleting need ALTER on the cluster,
describing DESCRIBE; without authorizer.enabled every one answers SECURITY_DISABLED, as Kafka without an authorizer."""
import logging

from kafka.protocol.admin.acl import (CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
                                      DescribeAclsRequest, DescribeAclsResponse)

from kop.handlers.context import RequestContext
from kop.security.acls import AclBinding, AclFilter, InvalidAcl, Operation
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


def _refusal(ctx: RequestContext, operation: Operation) -> tuple[ErrorCode, str] | None:
    if not ctx.authorizer.enabled:
        return ErrorCode.SECURITY_DISABLED, "no authorizer: set authorizer.enabled=true"
    if not ctx.authorized_on_cluster(operation):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{operation.name} on the cluster is needed"
    return None


async def create(ctx: RequestContext, request: CreateAclsRequest) -> CreateAclsResponse:
    cls = CreateAclsResponse[ctx.version]
    refused = _refusal(ctx, Operation.ALTER)
    results = []
    for creation in request.creations:
        acl = AclBinding(creation.resource_type, creation.resource_name, creation.resource_pattern_type,
                         creation.principal, creation.host, creation.operation, creation.permission_type)
        error = refused
        if error is None:
            try:
                await ctx.authorizer.add([acl])
                log.info("ACL added by %s: %s", ctx.principal, acl, extra=ctx.log_fields)
            except InvalidAcl as exc:
                error = ErrorCode.INVALID_REQUEST, str(exc)
            except OSError as exc:
                log.error("ACL not added: %s", exc, extra=ctx.log_fields)
                error = ErrorCode.UNKNOWN_SERVER_ERROR, f"not stored: {exc}"
        code, message = error or (ErrorCode.NONE, None)
        results.append(cls.AclCreationResult(error_code=code, error_message=message))
    return cls(throttle_time_ms=0, results=results)


def _filter(item) -> AclFilter:
    return AclFilter(item.resource_type_filter, item.resource_name_filter, item.pattern_type_filter,
                     item.principal_filter, item.host_filter, item.operation, item.permission_type)


async def describe(ctx: RequestContext, request: DescribeAclsRequest) -> DescribeAclsResponse:
    cls = DescribeAclsResponse[ctx.version]
    refused = _refusal(ctx, Operation.DESCRIBE)
    if refused:
        return cls(throttle_time_ms=0, error_code=refused[0], error_message=refused[1], resources=[])
    by_resource: dict[tuple[int, str, int], list] = {}
    for acl in ctx.authorizer.matching(_filter(request)):
        by_resource.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
            cls.DescribeAclsResource.AclDescription(principal=acl.principal, host=acl.host, operation=acl.operation,
                                                    permission_type=acl.permission))
    resources = [cls.DescribeAclsResource(resource_type=kind, resource_name=name, pattern_type=pattern, acls=acls)
                 for (kind, name, pattern), acls in by_resource.items()]
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, resources=resources)


async def delete(ctx: RequestContext, request: DeleteAclsRequest) -> DeleteAclsResponse:
    cls = DeleteAclsResponse[ctx.version]
    Result = cls.DeleteAclsFilterResult
    refused = _refusal(ctx, Operation.ALTER)
    results = []
    for item in request.filters:
        if refused:
            results.append(Result(error_code=refused[0], error_message=refused[1], matching_acls=[]))
            continue
        try:
            gone = await ctx.authorizer.delete(_filter(item))
        except OSError as exc:
            log.error("ACLs not deleted: %s", exc, extra=ctx.log_fields)
            results.append(Result(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message=f"not stored: {exc}",
                                  matching_acls=[]))
            continue
        for acl in gone:
            log.info("ACL deleted by %s: %s", ctx.principal, acl, extra=ctx.log_fields)
        results.append(Result(error_code=ErrorCode.NONE, error_message=None, matching_acls=[
            Result.DeleteAclsMatchingAcl(error_code=ErrorCode.NONE, error_message=None,
                                         resource_type=acl.resource_type, resource_name=acl.resource_name,
                                         pattern_type=acl.pattern_type, principal=acl.principal, host=acl.host,
                                         operation=acl.operation, permission_type=acl.permission)
            for acl in gone]))
    return cls(throttle_time_ms=0, filter_results=results)


ROUTES = [(DescribeAclsRequest.API_KEY, 1, 3, describe), (CreateAclsRequest.API_KEY, 1, 3, create),
          (DeleteAclsRequest.API_KEY, 1, 3, delete)]
