"""DescribeQuorum (key 55; `kafka-metadata-quorum.sh describe` and admin clients' describeMetadataQuorum). Version
notes: v1+ fetch and caught-up times, v2+ replica directory ids, error messages and the voters' endpoints (KIP-853).

kop has no KRaft metadata log: one broker is its own controller, so the quorum it reports is that broker alone, the
leader and only voter of `__cluster_metadata`-0 at epoch 0, with no observers. There is no log behind it, so the
high watermark and the voter's log end offset are 0 and the leader is always caught up (now). It needs DESCRIBE on
the cluster, as in Kafka."""
import uuid

from kafka.protocol.admin import DescribeQuorumRequest, DescribeQuorumResponse

from kop import clock
from kop.handlers.context import RequestContext
from kop.security.acls import Operation
from protocol.errors import ErrorCode

METADATA_TOPIC = "__cluster_metadata"


async def describe_quorum(ctx: RequestContext, request: DescribeQuorumRequest) -> DescribeQuorumResponse:
    cls = DescribeQuorumResponse[ctx.version]
    if not ctx.authorized_on_cluster(Operation.DESCRIBE):
        return cls(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message="not authorized to describe the "
                   "cluster", nodes=[], topics=[])
    me = ctx.endpoint
    now = clock.now_ms()
    ReplicaState = cls.TopicData.PartitionData.ReplicaState
    voter = ReplicaState(replica_id=me.node_id, replica_directory_id=uuid.UUID(int=0), log_end_offset=0,
                         last_fetch_timestamp=now, last_caught_up_timestamp=now)
    partition = cls.TopicData.PartitionData(partition_index=0, error_code=ErrorCode.NONE, error_message=None,
                                            leader_id=me.node_id, leader_epoch=0, high_watermark=0,
                                            current_voters=[voter], observers=[])
    node = cls.Node(node_id=me.node_id, listeners=[cls.Node.Listener(name=me.listener, host=me.host, port=me.port)])
    return cls(error_code=ErrorCode.NONE, error_message=None, nodes=[node],
               topics=[cls.TopicData(topic_name=METADATA_TOPIC, partitions=[partition])])


ROUTES = [(DescribeQuorumRequest.API_KEY, 0, 2, describe_quorum)]
