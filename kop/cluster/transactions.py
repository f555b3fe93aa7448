"""Transaction coordinators in a cluster: a transactional id is coordinated by the owner of its shard, as in Kafka.

Transactional ids are spread over the 50 shards of the transaction state log by Kafka's rule (the Java hash of the
id, modulo transaction.state.log.num.partitions' default of 50), and shard k is owned like any partition, by
rendezvous hashing of `__transaction_state-partition-k` over the live brokers: FindCoordinator names that broker and
every other one answers NOT_COORDINATOR. Each shard's state log is a managed ledger in PostgreSQL; the broker taking
a shard over opens it, which raises its epoch (the previous coordinator can no longer write a transition), replays it,
and completes the transactions it finds in PrepareCommit/PrepareAbort. The epoch is the coordinator epoch the
transaction's markers carry.

What the coordinator asks of other brokers (OtherBrokers, through kop/cluster/peers.py):
- a marker for a partition another broker owns: WriteTxnMarkers to that owner, as Kafka's coordinator sends it;
- a committed transaction's offsets for a group another broker coordinates: CommitTxnOffsets (kop's own request) to
  the group's coordinator;
- and the other way, a partition owner asks the coordinator whether a transactional batch belongs to an open
  transaction of its producer that holds the partition (AddPartitionsToTxn v4, verify only: KIP-890's verification),
  before it stores the first batch of a transaction: a batch that comes after its transaction ended is refused, so
  it cannot open a transaction no one will end.
"""
import logging
from collections.abc import Callable

from kafka.protocol.producer.transaction import (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
                                                 TxnOffsetCommitRequest, TxnOffsetCommitResponse,
                                                 WriteTxnMarkersRequest, WriteTxnMarkersResponse)

from kop.bounded import each_bounded
from kop.cluster import groups
from kop.cluster.ownership import java_hash_shard, taken_over
from kop.cluster.peers import PeerUnreachable, Peers
from kop.ledger import LedgerConfig, ManagedLedgerError
from kop.ledger.postgres import PgStore
from kop.ledger.postgres.ledger import PgManagedLedger
from kop.ledger.postgres.store import DATABASE_ERRORS, POOL_SIZE
from kop.transactions.coordinator import TransactionCoordinator
from kop.transactions.state import PendingOffset, TopicPartition
from kop.transactions.state_log import LEDGER_CONFIG, TxnStateLog
from protocol.errors import ErrorCode
from protocol.txn_offsets import CommitTxnOffsetsRequest, CommitTxnOffsetsResponse

log = logging.getLogger(__name__)

SHARDS = 50  # Kafka's transaction.state.log.num.partitions
SHARD_TOPIC = "__transaction_state"
MARKERS_VERSION = 1
VERIFY_VERSION = 4
TXN_OFFSET_COMMIT_VERSION = 3
# What a partition owner answers a producer when the coordinator could not verify its batch: retriable, as Kafka
# answers it (older clients know no better retriable code for it).
UNVERIFIED = ErrorCode.NOT_ENOUGH_REPLICAS


def shard_of(transactional_id: str) -> int:
    return java_hash_shard(transactional_id, SHARDS)


def shard_ledger(shard: int) -> str:
    """The managed ledger holding shard k's state log (no topic's: never an orphan to remove)."""
    return f"kop.coordinator/{SHARD_TOPIC}-{shard}"


class TxnShards:
    """Follows which transaction state log shards this broker owns, and loads or drops them in the coordinator."""

    def __init__(self, store: PgStore, config: LedgerConfig, coordinator: TransactionCoordinator,
                 owns: Callable[[str, int], bool], fresh: Callable[[], bool], leader: Callable[[str, int], int],
                 peers: Peers) -> None:
        """owns(topic, partition): the cluster's view; fresh(): whether that view is recent enough to act on;
        leader(topic, partition): the node that owns a partition."""
        self._store = store
        self._config = config
        self._coordinator = coordinator
        self._owns = owns
        self._fresh = fresh
        self.loaded: dict[int, int] = {}  # shard -> the epoch this broker opened its state log with
        self.others = ViaPeers(peers, leader, fresh)
        coordinator.join_cluster(shard_of, self.error_for, self.others)

    def error_for(self, transactional_id: str) -> ErrorCode | None:
        shard = shard_of(transactional_id)
        if not self._owns(SHARD_TOPIC, shard) or not self._fresh():
            return ErrorCode.NOT_COORDINATOR
        if shard not in self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return None

    async def release_all(self) -> None:
        for shard in sorted(self.loaded):
            await self._release(shard)

    def held(self) -> dict[str, int]:
        """The state log of each shard this broker has loaded, with the epoch it opened it with."""
        return {shard_ledger(shard): epoch for shard, epoch in self.loaded.items()}

    async def release_taken(self, stored: dict[str, int]) -> None:
        """Drop the shards whose state log another broker opened since (`stored`: ledger name -> epoch, read since
        `held()`), from a view already outdated: this one can no longer log a transition, and a shard it still
        owns is opened again at the next follow instead of failing every request until the view changes."""
        for shard in taken_over(self.loaded, shard_ledger, stored):
            await self._release(shard)
            log.warning("transaction coordinator shard %d was taken over by another broker: opening it again if "
                        "this broker still owns it", shard)

    async def _release(self, shard: int) -> None:
        self.loaded.pop(shard, None)
        await self._coordinator.drop_shard(shard)

    async def follow(self) -> None:
        """Load the shards this broker owns now and has not loaded; drop those it no longer owns."""
        owned = {shard for shard in range(SHARDS) if self._owns(SHARD_TOPIC, shard)}
        for shard in sorted(set(self.loaded) - owned):
            await self._release(shard)
            log.info("transaction coordinator shard %d moved to another broker", shard)
        # Each shard's state log is its own managed ledger: as many open and replay at once as the pool has
        # connections, rather than one after another (50 of them when one broker starts alone).
        await each_bounded(sorted(owned - set(self.loaded)), self._load, POOL_SIZE)

    async def _load(self, shard: int) -> None:
        ledger = await self._open(shard)
        if ledger is None:
            return
        state_log = TxnStateLog(ledger, ledger.epoch)
        try:
            states = await state_log.load_async()
        except OSError as exc:  # its entries could not be read back: closed, and tried again at the next beat
            log.warning("transaction coordinator shard %d not loaded yet: %s", shard, exc)
            await ledger.close()
            return
        self._coordinator.adopt_shard(shard, state_log, states)
        self.loaded[shard] = ledger.epoch

    async def _open(self, shard: int) -> PgManagedLedger | None:
        """The shard's state log, opened (which fences out its coordinator) while this broker's view gives it here."""
        if not (self._fresh() and self._owns(SHARD_TOPIC, shard)):
            return None
        try:
            return await PgManagedLedger.open(shard_ledger(shard), self._store, self._config)
        except (ManagedLedgerError, OSError, ValueError, *DATABASE_ERRORS) as exc:
            # The lease ran out meanwhile, the database is out of reach, or a stored entry is damaged (ValueError):
            # tried again at the next beat, and the shards opened before it are served meanwhile.
            log.warning("transaction coordinator shard %d not taken over yet: %s", shard, exc)
            return None


def shard_ledger_config(fsync: bool) -> LedgerConfig:
    return LedgerConfig(**LEDGER_CONFIG, fsync=fsync)


class ViaPeers:
    """OtherBrokers over kop/cluster/peers.py: each request to the broker that owns its partition or group now."""

    def __init__(self, peers: Peers, leader: Callable[[str, int], int], fresh: Callable[[], bool]) -> None:
        self._peers = peers
        self._leader = leader
        self._fresh = fresh

    async def write_marker(self, tp: TopicPartition, producer_id: int, producer_epoch: int, commit: bool,
                           coordinator_epoch: int) -> ErrorCode:
        if not self._fresh():  # this broker may have lost its lease: its view of who owns what may be stale
            return ErrorCode.NOT_COORDINATOR
        Marker = WriteTxnMarkersRequest.WritableTxnMarker
        request = WriteTxnMarkersRequest[MARKERS_VERSION](markers=[Marker(
            producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
            coordinator_epoch=coordinator_epoch,
            topics=[Marker.WritableTxnMarkerTopic(name=tp[0], partition_indexes=[tp[1]])])])
        try:
            answer = await self._peers.call(self._leader(*tp), request, WriteTxnMarkersResponse)
        except PeerUnreachable as exc:
            log.debug("marker for %s-%d not sent: %s", *tp, exc)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return _only_error(p.error_code for m in answer.markers for t in m.topics for p in t.partitions)

    async def commit_offset(self, group_id: str, tp: TopicPartition, pending: PendingOffset,
                            producer_id: int) -> ErrorCode:
        Topic = CommitTxnOffsetsRequest.CommitTxnOffsetsTopic
        return await self._to_group(group_id, CommitTxnOffsetsRequest[0](
            group_id=group_id, producer_id=producer_id, committed=True, topics=[Topic(name=tp[0], partitions=[
                Topic.CommitTxnOffsetsPartition(partition_index=tp[1], committed_offset=pending.offset,
                                                committed_leader_epoch=pending.leader_epoch,
                                                committed_metadata=pending.metadata,
                                                commit_timestamp=pending.commit_ms)])]))

    async def offsets_aborted(self, group_id: str, producer_id: int) -> ErrorCode:
        return await self._to_group(group_id, CommitTxnOffsetsRequest[0](group_id=group_id, producer_id=producer_id,
                                                                         committed=False, topics=[]))

    async def _to_group(self, group_id: str, request: CommitTxnOffsetsRequest) -> ErrorCode:
        try:
            answer = await self._peers.call(self._leader(groups.SHARD_TOPIC, groups.shard_of(group_id)), request,
                                            CommitTxnOffsetsResponse)
        except PeerUnreachable as exc:
            log.debug("the end of a transaction not sent to the coordinator of group %s: %s", group_id, exc)
            return ErrorCode.NOT_COORDINATOR
        if answer.error_code:
            return ErrorCode(answer.error_code)
        return _only_error(p.error_code for t in answer.topics for p in t.partitions) if request.topics \
            else ErrorCode.NONE

    async def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                                offsets: dict[TopicPartition, PendingOffset]) -> dict[TopicPartition, ErrorCode]:
        """A TxnOffsetCommit this broker took as the group's coordinator, handed to the transaction's (without a
        generation: this broker checked it)."""
        by_topic: dict[str, list] = {}
        for (topic, partition), pending in offsets.items():
            by_topic.setdefault(topic, []).append(TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
                                                  .TxnOffsetCommitRequestPartition(
                                                      partition_index=partition, committed_offset=pending.offset,
                                                      committed_leader_epoch=pending.leader_epoch,
                                                      committed_metadata=pending.metadata))
        request = TxnOffsetCommitRequest[TXN_OFFSET_COMMIT_VERSION](
            transactional_id=transactional_id, group_id=group_id, producer_id=producer_id,
            producer_epoch=producer_epoch, generation_id=-1, member_id="", group_instance_id=None,
            topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=name, partitions=partitions)
                    for name, partitions in by_topic.items()])
        try:
            answer = await self._peers.call(self._leader(SHARD_TOPIC, shard_of(transactional_id)), request,
                                            TxnOffsetCommitResponse)
        except PeerUnreachable as exc:
            log.debug("offsets of transaction %s not handed on: %s", transactional_id, exc)
            return {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in offsets}
        found = {(t.name, p.partition_index): ErrorCode(p.error_code) for t in answer.topics for p in t.partitions}
        return {tp: found.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR) for tp in offsets}

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     tp: TopicPartition) -> ErrorCode:
        """Whether the coordinator has this producer's transaction open with the partition in it: NONE, or the error
        to answer the producer."""
        Txn = AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction
        request = AddPartitionsToTxnRequest[VERIFY_VERSION](transactions=[Txn(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            verify_only=True, topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(
                name=tp[0], partitions=[tp[1]])])])
        try:
            answer = await self._peers.call(self._leader(SHARD_TOPIC, shard_of(transactional_id)), request,
                                            AddPartitionsToTxnResponse)
        except PeerUnreachable as exc:
            log.debug("transactional batch of %s not verified: %s", transactional_id, exc)
            return UNVERIFIED
        error = ErrorCode(answer.error_code) if answer.error_code else _only_error(
            p.partition_error_code for txn in answer.results_by_transaction for t in txn.topic_results
            for p in t.results_by_partition)
        if error in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                     ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.CONCURRENT_TRANSACTIONS):
            return UNVERIFIED
        return error


def _only_error(codes) -> ErrorCode:
    """The first error among the answer's codes, NONE when there is none; an answer naming nothing is an error."""
    found = [ErrorCode(code) for code in codes]
    if not found:
        return ErrorCode.UNKNOWN_SERVER_ERROR
    return next((code for code in found if code != ErrorCode.NONE), ErrorCode.NONE)
