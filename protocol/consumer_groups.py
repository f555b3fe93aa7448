"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69), KIP-848's consumer group protocol. kafka-python 3 has
no schemas for them; they are in `protocol/messages/`, in Kafka's JSON message format, so kafka-python's machinery
encodes and decodes them like its own."""
from kafka.protocol.api_message import ApiMessage

from protocol import messages


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=messages):
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=messages):
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=messages):
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=messages):
    pass
