"""DescribeCluster (key 60). Version notes: v1 adds the endpoint type (1 = brokers); v2 asks for fenced brokers
too and marks them (KIP-1073). The brokers are the live members of the cluster (kop/cluster), this one alone on
the file engine; each answers as the controller, and none is fenced (a broker whose lease ran out is not listed).
The brokers are the same as Metadata lists; the operations the principal may do on the cluster when asked
(KIP-430)."""
from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from kafka.protocol.metadata import MetadataResponse

from kop.handlers.context import RequestContext
from kop.handlers.metadata import broker_list
from kop.security.acls import CLUSTER_NAME, ResourceType
from protocol.errors import ErrorCode

BROKERS_ENDPOINT = 1


async def describe_cluster(ctx: RequestContext, request: DescribeClusterRequest) -> DescribeClusterResponse:
    cls = DescribeClusterResponse[ctx.version]
    brokers = [cls.DescribeClusterBroker(broker_id=b.node_id, host=b.host, port=b.port, rack=None, is_fenced=False)
               for b in broker_list(ctx, MetadataResponse[0])]
    operations = ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME) \
        if request.include_cluster_authorized_operations else None
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=BROKERS_ENDPOINT,
               cluster_id=ctx.config.cluster_id, controller_id=ctx.endpoint.node_id, brokers=brokers,
               authorized_operations=operations)


ROUTES = [(DescribeClusterRequest.API_KEY, 0, 2, describe_cluster)]
