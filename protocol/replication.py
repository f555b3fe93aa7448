"""ReplicateEntries (api key 32000, kop's own): what a geo-replicator sends to a broker of another cluster. The
schemas are in `protocol/messages/`, in Kafka's JSON message format, so kafka-python's machinery encodes and decodes
them like any Kafka API. A broker that does not list the key in ApiVersions does not speak it."""
from kafka.protocol.api_message import ApiMessage

from protocol import messages

REPLICATE_ENTRIES_KEY = 32000


class ReplicateEntriesRequest(ApiMessage, load_json=messages):
    pass


class ReplicateEntriesResponse(ApiMessage, load_json=messages):
    pass
