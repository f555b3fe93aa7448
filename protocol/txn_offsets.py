"""CommitTxnOffsets (api key 32001, kop's own): in a cluster, what a transaction coordinator sends a group's
coordinator when a transaction that committed offsets for the group commits. Schemas in `protocol/messages/`."""
from kafka.protocol.api_message import ApiMessage

from protocol import messages

COMMIT_TXN_OFFSETS_KEY = 32001


class CommitTxnOffsetsRequest(ApiMessage, load_json=messages):
    pass


class CommitTxnOffsetsResponse(ApiMessage, load_json=messages):
    pass
