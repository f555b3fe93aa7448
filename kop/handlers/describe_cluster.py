"""DescribeCluster (key 60). Version notes: v1 adds the endpoint type (1 = brokers). One broker is the whole
cluster and its controller."""
from protocol.api import response_class
from protocol.errors import ErrorCode


async def describe_cluster(ctx, request):
    cls = response_class(60, ctx.version)
    cfg = ctx.broker.config
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=1,
               cluster_id=cfg.cluster_id, controller_id=cfg.node_id,
               brokers=[cls.DescribeClusterBroker(broker_id=cfg.node_id, host=cfg.advertised,
                                                  port=ctx.broker.advertised_port, rack=None, is_fenced=False)])


ROUTES = [(60, 0, 1, describe_cluster)]
