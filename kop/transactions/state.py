"""A transactional id's state, as Kafka's transaction coordinator keeps it, and its record in the state log.

States (Kafka's numbering): Empty (no transaction yet, or initialised), Ongoing (partitions or a group added),
PrepareCommit/PrepareAbort (the decision is durable, markers are being written), CompleteCommit/CompleteAbort
(markers written), Dead (expired). `pending` is in memory only: a transition whose record (or markers) is being
written, during which the id answers CONCURRENT_TRANSACTIONS."""
from dataclasses import dataclass, field
from enum import IntEnum

from proto.kop_pb2 import TransactionLogRecord, TxnOffset, TxnTopicPartition

NO_PRODUCER_ID = -1
NO_EPOCH = -1


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6

    @property
    def kafka_name(self) -> str:
        """As DescribeTransactions and ListTransactions name it."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def complete(self) -> bool:
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PendingOffset:
    """An offset committed in a transaction: the group's committed offset once the transaction commits."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int = -1  # when TxnOffsetCommit stored it (-1: unknown, from a record written before it was kept)


@dataclass
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    last_producer_id: int = NO_PRODUCER_ID  # before a rotation (epoch exhausted): a retry of it gets the new id
    last_producer_epoch: int = NO_EPOCH  # the epoch before the last bump: a retry of that InitProducerId is answered
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    pending_offsets: dict[tuple[str, str, int], PendingOffset] = field(default_factory=dict)  # (group, topic, p)
    start_ms: int = -1  # when the transaction became Ongoing
    update_ms: int = 0
    pending: bool = False  # a transition is being written (not stored)

    def to_record(self) -> TransactionLogRecord:
        return TransactionLogRecord(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            last_producer_id=self.last_producer_id, last_producer_epoch=self.last_producer_epoch,
            timeout_ms=self.timeout_ms, state=int(self.state),
            partitions=[TxnTopicPartition(topic=t, partition=p) for t, p in sorted(self.partitions)],
            groups=sorted(self.groups),
            pending_offsets=[TxnOffset(group_id=g, topic=t, partition=p, offset=o.offset, leader_epoch=o.leader_epoch,
                                       metadata=o.metadata, commit_ms=o.commit_ms)
                             for (g, t, p), o in sorted(self.pending_offsets.items())],
            start_ms=self.start_ms, update_ms=self.update_ms)

    @classmethod
    def from_record(cls, record: TransactionLogRecord) -> "TxnMetadata":
        return cls(record.transactional_id, record.producer_id, record.producer_epoch, record.timeout_ms,
                   TxnState(record.state), record.last_producer_id, record.last_producer_epoch,
                   {(tp.topic, tp.partition) for tp in record.partitions}, set(record.groups),
                   {(o.group_id, o.topic, o.partition): PendingOffset(o.offset, o.leader_epoch, o.metadata,
                                                                     o.commit_ms)
                    for o in record.pending_offsets},
                   record.start_ms, record.update_ms)
