"""DescribeCluster (key 60). Version notes: v1 adds the endpoint type (1 = brokers); v2 asks for fenced brokers
too and marks them (KIP-1073). One broker is the whole cluster and its controller, and never fenced."""
from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from kop.handlers.context import RequestContext
from protocol.errors import ErrorCode

BROKERS_ENDPOINT = 1


async def describe_cluster(ctx: RequestContext, request: DescribeClusterRequest) -> DescribeClusterResponse:
    cls = DescribeClusterResponse[ctx.version]
    me = ctx.endpoint
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=BROKERS_ENDPOINT,
               cluster_id=ctx.config.cluster_id, controller_id=me.node_id,
               brokers=[cls.DescribeClusterBroker(broker_id=me.node_id, host=me.host, port=me.port, rack=None,
                                                  is_fenced=False)])


ROUTES = [(DescribeClusterRequest.API_KEY, 0, 2, describe_cluster)]
