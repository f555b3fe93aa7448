"""Producer deduplication: Pulsar's PIP-6 core and Kafka's idempotent-producer rules on top of it.

No I/O here: storage is reached through the Protocols of `dedup.interfaces`, and nothing imports from `kop`.
"""

from dedup.interfaces import (
    BEFORE_FIRST,
    DEDUP_CURSOR_NAME,
    DedupCursor,
    DedupLedger,
    EntrySource,
    Position,
    ReplayEntry,
)
from dedup.kafka_producers import (
    Accept,
    BatchMetadata,
    DecideAgain,
    Decision,
    Duplicate,
    KafkaProducers,
    PendingBatch,
    ProducerSnapshot,
    Reject,
    WaitFor,
    WriteFailed,
    acknowledged_range,
)
from dedup.message_deduplication import DedupConfig, DupStatus, MessageDeduplication, Status

__all__ = [
    "BEFORE_FIRST", "DEDUP_CURSOR_NAME", "DedupCursor", "DedupLedger", "EntrySource", "Position", "ReplayEntry",
    "Accept", "BatchMetadata", "DecideAgain", "Decision", "Duplicate", "KafkaProducers", "PendingBatch",
    "ProducerSnapshot", "Reject", "WaitFor", "WriteFailed", "acknowledged_range",
    "DedupConfig", "DupStatus", "MessageDeduplication", "Status",
]
