"""ReplicatedGroupOffsets (api key 32002) and MoveReplicatedGroup (32003), kop's own, between the brokers of a
cluster: PIP-33 snapshots and UPDATEs reach a replicated group through its coordinator, wherever the partition is
served. Schemas in `protocol/messages/`."""
from kafka.protocol.api_message import ApiMessage

from protocol import messages

REPLICATED_GROUP_OFFSETS_KEY = 32002
MOVE_REPLICATED_GROUP_KEY = 32003


class ReplicatedGroupOffsetsRequest(ApiMessage, load_json=messages):
    pass


class ReplicatedGroupOffsetsResponse(ApiMessage, load_json=messages):
    pass


class MoveReplicatedGroupRequest(ApiMessage, load_json=messages):
    pass


class MoveReplicatedGroupResponse(ApiMessage, load_json=messages):
    pass
