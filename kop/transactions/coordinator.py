"""The transaction coordinator: every transactional id this broker serves, their producer ids and epochs, their
transactions' partitions, groups and offsets, and the markers that end them.

One broker serves every id, from one state log. In a cluster (kop/cluster/transactions.py) ids are spread over the
shards of the transaction state log by Kafka's hash, each shard coordinated by the broker that owns it: its log is in
PostgreSQL, and a broker taking a shard over replays it (finishing the transactions it finds in Prepare*), while the
others answer NOT_COORDINATOR for its ids. Markers for partitions other brokers own go to their owner
(WriteTxnMarkers, as Kafka's coordinator sends them), and a committed transaction's offsets to its group's
coordinator (kop/cluster/transactions.py).

Each transition is written to the state log (kop/transactions/state_log.py) before it is answered and installed, so
a crash loses nothing that was acknowledged; while it is being written the id answers CONCURRENT_TRANSACTIONS. Once
PrepareCommit/PrepareAbort is durable the decision is final: the markers (one COMMIT or ABORT control batch per
partition) and the transaction's offsets follow, retried until they are stored; a transaction caught in Prepare* by a
crash completes when the broker starts again. EndTxn is answered when the transaction is complete (a few local
writes) or COMPLETION_WAIT_S after the decision, whichever comes first: Kafka answers at the decision, and its
clients' next AddPartitionsToTxn then meets CONCURRENT_TRANSACTIONS and backs off, which costs more than the wait.

Fencing: InitProducerId bumps the epoch (a new producer id once the epoch is exhausted), so the previous holder of the
transactional id is refused from then on: PRODUCER_FENCED by the coordinator (handlers answer it as
INVALID_PRODUCER_EPOCH to versions that predate it), INVALID_PRODUCER_EPOCH on Produce. A transaction left open past
its timeout is aborted with a bumped epoch, which fences its producer the same way.
"""
import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from kop import clock
from kop.config import BrokerConfig
from kop.groups import GroupCoordinator
from kop.groups.offsets import java_length
from kop.groups.txn_offsets import HandingOn
from kop.ledger import ManagedLedgerError
from kop.producer_ids import MAX_EPOCH, ProducerIdAllocator
from kop.topics import TopicManager
from kop.transactions.state import PendingOffset, TopicPartition, TxnMetadata, TxnState
from kop.transactions.state_log import TxnStateLog
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

MARKER_RETRY_S = 0.1  # between attempts to store a marker or an offset of a completing transaction
COMPLETION_WAIT_S = 2.0  # how long EndTxn waits for the markers after the decision before it answers anyway
Identity = tuple[ErrorCode, int, int]  # (error, producer id, epoch) answered to InitProducerId
EVERY_ID = -1  # the one shard of a broker that serves every transactional id


class OtherBrokers(Protocol):
    """In a cluster: what the coordinator asks of the brokers that own what it does not (kop/cluster)."""

    async def write_marker(self, tp: TopicPartition, producer_id: int, producer_epoch: int, commit: bool,
                           coordinator_epoch: int) -> ErrorCode: ...

    async def commit_offset(self, group_id: str, tp: TopicPartition, pending: PendingOffset,
                            producer_id: int) -> ErrorCode: ...

    async def offsets_aborted(self, group_id: str, producer_id: int) -> ErrorCode: ...

    async def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                                offsets: dict[TopicPartition, PendingOffset]) -> dict[TopicPartition, ErrorCode]: ...

    async def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
                     tp: TopicPartition) -> ErrorCode: ...


def _now_ms() -> int:
    return clock.now_ms()


def _copy(meta: TxnMetadata, **changes) -> TxnMetadata:
    fields = dict(partitions=set(meta.partitions), groups=set(meta.groups),
                  pending_offsets=dict(meta.pending_offsets), pending=False)
    fields.update(changes)
    return dataclasses.replace(meta, **fields)


class TransactionCoordinator:
    def __init__(self, config: BrokerConfig, topics: TopicManager, groups: GroupCoordinator,
                 producer_ids: ProducerIdAllocator) -> None:
        self.config = config
        self.topics = topics
        self.groups = groups
        self.producer_ids = producer_ids
        self.states: dict[str, TxnMetadata] = {}
        self._by_producer: dict[int, str] = {}  # producer id -> transactional id
        self._logs: dict[int, TxnStateLog] = {}  # shard -> its state log, for the shards this broker serves
        self._tasks: set[asyncio.Task] = set()
        self._completing: dict[str, asyncio.Task] = {}  # transactional id -> the completion writing its markers
        self._new_ids_writing = 0  # InitProducerId of ids not in `states` yet, their first record in flight
        self._closing = False
        self._clustered = False
        self._shard_of: Callable[[str], int] = lambda transactional_id: EVERY_ID
        self._serves: Callable[[str], ErrorCode | None] = lambda transactional_id: None
        self._others: OtherBrokers | None = None

    # ---- lifecycle

    def join_cluster(self, shard_of: Callable[[str], int], serves: Callable[[str], ErrorCode | None],
                     others: OtherBrokers) -> None:
        """Serve only the ids of the shards kop/cluster/transactions.py adopts; serves(id): why this broker may not
        serve the id now (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS), None when it may."""
        self._clustered = True
        self._shard_of, self._serves, self._others = shard_of, serves, others

    def start(self) -> None:
        """Load the state log (topics must be loaded) and finish the transactions a crash left in Prepare*; in a
        cluster the shards come and go with their ownership instead."""
        if not self._clustered:
            state_log = TxnStateLog.on_files(self.config.data_dir, self.config.fsync)
            self.adopt_shard(EVERY_ID, state_log, state_log.load())
        self._spawn(self._expiry_loop())

    def adopt_shard(self, shard: int, state_log: TxnStateLog, states: dict[str, TxnMetadata]) -> None:
        """Serve the ids of a shard from its replayed log, resuming the transactions it left in Prepare*."""
        self._logs[shard] = state_log
        for transactional_id, meta in states.items():
            self.states[transactional_id] = meta
            self._by_producer[meta.producer_id] = transactional_id
        for meta in states.values():
            if meta.state.preparing:
                log.info("transaction %s (producer %d epoch %d) resumes in %s", meta.transactional_id,
                         meta.producer_id, meta.producer_epoch, meta.state.name)
                self._resume(meta)
        log.info("transaction coordinator loaded %d transactional ids%s", len(states),
                 "" if shard == EVERY_ID else f" of shard {shard}")

    async def drop_shard(self, shard: int) -> None:
        """Another broker coordinates the shard now: forget its ids and stop completing their transactions (the new
        coordinator replays the log and completes them)."""
        state_log = self._logs.pop(shard, None)
        for transactional_id in [t for t in self.states if self._shard_of(t) == shard]:
            task = self._completing.pop(transactional_id, None)
            if task is not None:
                task.cancel()
            meta = self.states.pop(transactional_id)
            if self._by_producer.get(meta.producer_id) == transactional_id:
                del self._by_producer[meta.producer_id]
        if state_log is not None:
            await state_log.close()

    async def stop(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for state_log in list(self._logs.values()):
            await state_log.close()
        self._logs.clear()

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _resume(self, meta: TxnMetadata) -> asyncio.Task:
        task = self._spawn(self._complete(meta))
        transactional_id = meta.transactional_id
        self._completing[transactional_id] = task
        task.add_done_callback(lambda done: self._completing.pop(transactional_id, None)
                               if self._completing.get(transactional_id) is done else None)
        return task

    def serves(self, transactional_id: str) -> ErrorCode | None:
        """Why this broker may not coordinate the id now (None: it may)."""
        return self._serves(transactional_id)

    def _log_of(self, transactional_id: str) -> TxnStateLog | None:
        return self._logs.get(self._shard_of(transactional_id))

    # ---- storing transitions

    async def _transition(self, current: TxnMetadata | None, new: TxnMetadata) -> ErrorCode:
        """Write `new` to the state log, then install it; `current` answers CONCURRENT_TRANSACTIONS meanwhile."""
        state_log = self._log_of(new.transactional_id)
        if state_log is None:  # its shard moved away meanwhile
            return ErrorCode.NOT_COORDINATOR
        if current is not None:
            current.pending = True
        else:
            self._new_ids_writing += 1  # not in `states` yet: compaction must wait for it as for a pending one
        new.update_ms = _now_ms()
        try:
            await state_log.append(new.to_record())
        except (ManagedLedgerError, OSError) as exc:
            log.error("transaction %s: state log write failed: %s", new.transactional_id, exc)
            return ErrorCode.NOT_COORDINATOR  # the client looks the coordinator up again and retries
        finally:
            if current is not None:
                current.pending = False
            else:
                self._new_ids_writing -= 1
        if self._log_of(new.transactional_id) is not state_log:  # stored, but the shard moved: its owner has it
            return ErrorCode.NOT_COORDINATOR
        if current is not None and current.producer_id != new.producer_id:
            self._by_producer.pop(current.producer_id, None)
        self.states[new.transactional_id] = new
        self._by_producer[new.producer_id] = new.transactional_id
        return ErrorCode.NONE

    async def _next_identity(self, meta: TxnMetadata) -> dict:
        """The fields of a bumped epoch: the same id with epoch + 1, or a new id when the epoch is exhausted."""
        if meta.producer_epoch + 1 >= MAX_EPOCH:
            return dict(producer_id=await self.producer_ids.allocate(), producer_epoch=0,
                        last_producer_id=meta.producer_id, last_producer_epoch=meta.producer_epoch)
        return dict(producer_epoch=meta.producer_epoch + 1, last_producer_id=meta.producer_id,
                    last_producer_epoch=meta.producer_epoch)

    # ---- InitProducerId

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int,
                               producer_epoch: int) -> Identity:
        not_here = self._serves(transactional_id)
        if not_here is not None:
            return not_here, -1, -1
        if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
            return ErrorCode.INVALID_TRANSACTION_TIMEOUT, -1, -1
        meta = self.states.get(transactional_id)
        if meta is None:
            new = TxnMetadata(transactional_id, await self.producer_ids.allocate(), 0, timeout_ms)
            error = await self._transition(None, new)
            return (error, new.producer_id, new.producer_epoch) if error == ErrorCode.NONE else (error, -1, -1)
        if meta.pending or meta.state.preparing:
            return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
        if producer_id >= 0 and (producer_id, producer_epoch) != (meta.producer_id, meta.producer_epoch):
            recovering = (producer_id, producer_epoch) == (meta.last_producer_id, meta.last_producer_epoch) \
                and meta.state.complete
            if not recovering:
                return ErrorCode.PRODUCER_FENCED, -1, -1
            if meta.producer_epoch < MAX_EPOCH:
                # A retry whose answer was lost, or the producer whose transaction the coordinator aborted: it
                # gets the current epoch, which no other producer holds.
                return ErrorCode.NONE, meta.producer_id, meta.producer_epoch
            # The fencing abort took the last epoch: a new producer id below, as for any exhausted epoch.
        if meta.state is TxnState.ONGOING:
            # The previous producer's transaction is aborted under a new epoch; the client retries meanwhile.
            log.info("transaction %s: InitProducerId aborts the open transaction of producer %d epoch %d",
                     transactional_id, meta.producer_id, meta.producer_epoch)
            await self._abort_fenced(meta)
            return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1
        new = _copy(meta, **(await self._next_identity(meta)), timeout_ms=timeout_ms, state=TxnState.EMPTY,
                    partitions=set(), groups=set(), pending_offsets={}, start_ms=-1)
        error = await self._transition(meta, new)
        if error != ErrorCode.NONE:
            return error, -1, -1
        log.info("transaction %s: producer %d epoch %d (was %d epoch %d)", transactional_id, new.producer_id,
                 new.producer_epoch, meta.producer_id, meta.producer_epoch)
        return ErrorCode.NONE, new.producer_id, new.producer_epoch

    # ---- adding partitions and groups

    def _check_producer(self, meta: TxnMetadata | None, producer_id: int, producer_epoch: int) -> ErrorCode | None:
        """Kafka's order: this broker must coordinate the id, the id map to this producer, its epoch be current, no
        transition be in flight."""
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending or meta.state.preparing:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return None

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        wanted = set(partitions)
        meta = self.states.get(transactional_id)
        error = self._serves(transactional_id) or self._check_producer(meta, producer_id, producer_epoch)
        if error is None:
            unknown = {tp for tp in wanted if not self._exists(*tp)}
            if unknown:
                return {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                        else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in wanted}
            if meta.state is TxnState.ONGOING and wanted <= meta.partitions:
                error = ErrorCode.NONE
            else:
                try:
                    for tp in wanted:  # a no-op for a partition marked before; another broker's marks its own
                        if (partition := self.topics.partition(*tp)) is not None:
                            await partition.expect_transactions()
                except (ManagedLedgerError, OSError) as exc:
                    log.warning("transactional id %s: partitions not added: %s", transactional_id, exc)
                    return {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE for tp in wanted}  # retriable
                if self.states.get(transactional_id) is not meta or meta.pending:
                    # A timeout abort or a new producer's InitProducerId came meanwhile: decided on the old state,
                    # the transition would undo it. The client retries and gets the answer of the new one.
                    return {tp: ErrorCode.CONCURRENT_TRANSACTIONS for tp in wanted}
                error = await self._transition(meta, self._ongoing(meta, partitions=meta.partitions | wanted))
        return {tp: error for tp in wanted}

    def _exists(self, topic: str, index: int) -> bool:
        """The partition exists (here, or on the broker that owns it)."""
        if self.topics.partition(topic, index) is not None:
            return True
        known = self.topics.get(topic) if self._clustered else None
        return known is not None and 0 <= index < known.count

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str) -> ErrorCode:
        meta = self.states.get(transactional_id)
        error = self._serves(transactional_id) or self._check_producer(meta, producer_id, producer_epoch)
        if error is not None:
            return error
        if meta.state is TxnState.ONGOING and group_id in meta.groups:
            return ErrorCode.NONE
        return await self._transition(meta, self._ongoing(meta, groups=meta.groups | {group_id}))

    @staticmethod
    def _ongoing(meta: TxnMetadata, **changes) -> TxnMetadata:
        if meta.state is not TxnState.ONGOING:  # a new transaction starts
            changes.update(state=TxnState.ONGOING, start_ms=_now_ms())
        return _copy(meta, **changes)

    async def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                                offsets: dict[TopicPartition, PendingOffset]) -> dict[TopicPartition, ErrorCode]:
        """Offsets a transaction commits for a group it added: the group's committed offsets once it commits."""
        meta = self.states.get(transactional_id)
        error = self._serves(transactional_id) or _txn_offsets_error(meta, producer_id, producer_epoch, group_id)
        if error == ErrorCode.NOT_COORDINATOR and self._others is not None and self.groups.check(group_id) is None:
            # The group's coordinator, not the transaction's: the offsets go to the transaction's coordinator, and
            # the group's holds which partitions they are for (require_stable), here and after its shard moves.
            handing = self.groups.txn_offsets.handing_on(group_id, producer_id)
            try:
                handed = await self._others.txn_offset_commit(transactional_id, group_id, producer_id,
                                                              producer_epoch, offsets)
            finally:
                self.groups.txn_offsets.settled(handing)
            return await self._held(handing, handed)
        if error is not None:
            return {tp: error for tp in offsets}
        # In a cluster the group's coordinator keeps which partitions the transaction holds (they go with its shard).
        handing = self.groups.txn_offsets.handing_on(group_id, producer_id) \
            if self._clustered and self.groups.check(group_id) is None else None
        results: dict[TopicPartition, ErrorCode] = {}
        stored = dict(meta.pending_offsets)
        for tp, pending in offsets.items():
            if not self._exists(*tp):
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif java_length(pending.metadata) > self.config.offset_metadata_max_bytes:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                stored[(group_id, *tp)] = dataclasses.replace(pending, commit_ms=_now_ms())
                results[tp] = ErrorCode.NONE
        try:
            if stored != meta.pending_offsets:
                error = await self._transition(meta, _copy(meta, pending_offsets=stored))
                if error != ErrorCode.NONE:
                    return {tp: error for tp in offsets}
        finally:
            if handing is not None:
                self.groups.txn_offsets.settled(handing)
        return results if handing is None else await self._held(handing, results)

    async def _held(self, handing: HandingOn,
                    results: dict[TopicPartition, ErrorCode]) -> dict[TopicPartition, ErrorCode]:
        """The group's coordinator notes the partitions the transaction accepted offsets for; if it cannot, the
        client is sent to look the coordinator up again (and its retry notes them there)."""
        accepted = [tp for tp, code in results.items() if code == ErrorCode.NONE]
        if accepted and not await self.groups.txn_offsets.hold(handing, accepted):
            return {tp: ErrorCode.NOT_COORDINATOR if tp in accepted else code for tp, code in results.items()}
        return results

    def has_pending_offset(self, group_id: str, topic: str, partition: int) -> bool:
        """An open transaction holds an offset for this group partition (OffsetFetch require_stable waits)."""
        key = (group_id, topic, partition)
        return self.groups.txn_offsets.holds(*key) or any(key in meta.pending_offsets for meta in self.states.values())

    async def transaction_ended(self, group_id: str, producer_id: int,
                                partitions: Iterable[TopicPartition] | None = None) -> bool:
        """A transaction whose offsets for this broker's group were held has ended: its offsets of these partitions
        are committed (None: it aborted, none will come). False if that could not be stored yet."""
        return await self.groups.txn_offsets.ended(group_id, producer_id, partitions)

    # ---- ending

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                      commit: bool) -> ErrorCode:
        not_here = self._serves(transactional_id)
        if not_here is not None:
            return not_here
        meta = self.states.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if meta.state is TxnState.ONGOING:
            return await self._prepare(meta, commit)
        if meta.state.preparing:
            preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            return ErrorCode.CONCURRENT_TRANSACTIONS if meta.state is preparing else ErrorCode.INVALID_TXN_STATE
        return ErrorCode.NONE if meta.state is wanted else ErrorCode.INVALID_TXN_STATE

    async def _prepare(self, meta: TxnMetadata, commit: bool, **changes) -> ErrorCode:
        prepared = _copy(meta, state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT, **changes)
        if not commit:
            prepared.pending_offsets = {}
        error = await self._transition(meta, prepared)
        if error == ErrorCode.NONE:
            await asyncio.wait([self._resume(prepared)], timeout=COMPLETION_WAIT_S)
        return error

    async def _abort_fenced(self, meta: TxnMetadata) -> ErrorCode:
        """Abort an open transaction under a bumped epoch, so its producer is fenced. The id stays (its markers
        close what it wrote); the epoch may reach MAX_EPOCH here, and the next InitProducerId then rotates the id.
        At MAX_EPOCH already there is no epoch left to fence with: the abort keeps it (Kafka cannot fence there
        either)."""
        return await self._prepare(meta, False, producer_epoch=min(meta.producer_epoch + 1, MAX_EPOCH),
                                   last_producer_id=meta.producer_id, last_producer_epoch=meta.producer_epoch)

    async def _complete(self, meta: TxnMetadata) -> None:
        """Write the markers and (on commit) the offsets of a prepared transaction, then record it complete. Ends
        when the shard moves (drop_shard cancels it; its new coordinator completes the transaction)."""
        commit = meta.state is TxnState.PREPARE_COMMIT
        state_log = self._log_of(meta.transactional_id)
        if state_log is None:
            return
        await asyncio.gather(*(self._write_marker(meta, tp, commit, state_log.coordinator_epoch)
                               for tp in sorted(meta.partitions)))
        for (group_id, topic, partition), pending in sorted(meta.pending_offsets.items()):
            await self._commit_offset(meta, group_id, topic, partition, pending)
        if not commit:
            for group_id in sorted(meta.groups):
                await self._end_offsets(meta, group_id)
        done = _copy(meta, state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT, partitions=set(),
                     groups=set(), pending_offsets={}, start_ms=-1)
        while await self._transition(meta, done) != ErrorCode.NONE:
            if self._log_of(meta.transactional_id) is not state_log:
                return
            await asyncio.sleep(MARKER_RETRY_S)
        log.debug("transaction %s of producer %d epoch %d %s (%d partitions)", meta.transactional_id,
                 meta.producer_id, meta.producer_epoch, "committed" if commit else "aborted", len(meta.partitions))
        # Compaction must not drop a record in flight: it rewrites the shard's states and deletes every record
        # before them.
        if not self._new_ids_writing and not any(m.pending for m in self.states.values()):
            shard = self._shard_of(meta.transactional_id)
            await state_log.compact_if_due({t: m for t, m in self.states.items() if self._shard_of(t) == shard})

    async def _write_marker(self, meta: TxnMetadata, tp: TopicPartition, commit: bool,
                            coordinator_epoch: int) -> None:
        while not self._closing:
            partition = self.topics.partition(*tp)
            if partition is not None:
                result = await partition.publish_control(meta.producer_id, meta.producer_epoch, commit,
                                                         coordinator_epoch)
                error, message = result.error, result.message
            elif not self._exists(*tp):
                return  # the topic was deleted: nothing left to mark
            elif self._others is None:
                error, message = ErrorCode.NOT_LEADER_OR_FOLLOWER, "not open here yet"
            else:  # another broker's partition: its owner writes the marker
                error = await self._others.write_marker(tp, meta.producer_id, meta.producer_epoch, commit,
                                                        coordinator_epoch)
                message = None
            if error in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                return
            if error == ErrorCode.TRANSACTION_COORDINATOR_FENCED:  # a later coordinator of the shard marked it
                log.warning("transaction %s: a later coordinator has written markers on %s-%d: this one stops",
                            meta.transactional_id, *tp)
                return
            log.warning("transaction %s: %s marker on %s-%d failed (%s), retrying", meta.transactional_id,
                        "COMMIT" if commit else "ABORT", *tp, message or error.name)
            await asyncio.sleep(MARKER_RETRY_S)

    async def _commit_offset(self, meta: TxnMetadata, group_id: str, topic: str, partition: int,
                             pending: PendingOffset) -> None:
        """The group's committed offset becomes the pending one, unless the group committed after the
        TxnOffsetCommit (as Kafka orders them, by when each was written): a completion replayed after a crash, or
        one that ran while a plain commit or another transaction's landed, never moves an offset back."""
        while not self._closing:
            remote = self._others is not None and self.groups.check(group_id) == ErrorCode.NOT_COORDINATOR
            if remote:
                error = await self._others.commit_offset(group_id, (topic, partition), pending, meta.producer_id)
            else:
                error = await self.groups.commit(group_id, topic, partition, pending.offset, pending.leader_epoch,
                                                 pending.metadata, pending.commit_ms,
                                                 keep_newer=pending.commit_ms >= 0)
            if error in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) and not remote \
                    and not await self.transaction_ended(group_id, meta.producer_id, [(topic, partition)]):
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            if error in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                return
            log.warning("transaction %s: offset of %s on %s-%d failed (%s), retrying", meta.transactional_id,
                        group_id, topic, partition, error.name)
            await asyncio.sleep(MARKER_RETRY_S)

    async def _end_offsets(self, meta: TxnMetadata, group_id: str) -> None:
        """An aborted transaction's group learns, from here or on the broker that coordinates it, that the
        transaction's offsets will never come."""
        while not self._closing:
            where = self.groups.check(group_id) if self._others is not None else None
            if where == ErrorCode.NOT_COORDINATOR:
                error = await self._others.offsets_aborted(group_id, meta.producer_id)
            elif where == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                error = where  # its shard is being taken over here: once loaded it holds what is to be cleared
            elif where is not None:
                return  # a group id no coordinator serves (INVALID_GROUP_ID): none of its offsets were held
            else:
                stored = await self.transaction_ended(group_id, meta.producer_id)
                error = ErrorCode.NONE if stored else ErrorCode.COORDINATOR_NOT_AVAILABLE
            if error == ErrorCode.NONE:
                return
            log.warning("transaction %s: the coordinator of group %s not told of the abort (%s), retrying",
                        meta.transactional_id, group_id, error.name)
            await asyncio.sleep(MARKER_RETRY_S)

    # ---- the produce path

    def check_produce(self, producer_id: int, producer_epoch: int, topic: str, partition: int) -> ErrorCode | None:
        """May a transactional batch of this producer go to this partition? Only while its transaction is open and
        holds the partition: a batch that comes late, after its transaction ended (or for a partition never added)
        would otherwise open a transaction no one will end (KIP-890's hanging transaction)."""
        meta = self.states.get(self._by_producer.get(producer_id, ""))
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.INVALID_TXN_STATE
        if producer_epoch < meta.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if meta.state is not TxnState.ONGOING or producer_epoch != meta.producer_epoch \
                or (topic, partition) not in meta.partitions:
            return ErrorCode.INVALID_TXN_STATE
        return None

    def judges(self, transactional_id: str | None) -> bool:
        """Whether this broker judges a transactional batch itself (it coordinates the transactional id, or it is
        the only broker, or the request names no id: then only a producer this broker coordinates may write it);
        else its coordinator is asked (`verify_elsewhere`)."""
        return not self._clustered or transactional_id is None or self._serves(transactional_id) is None

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
               partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """A partition owner asks whether a transactional batch may be stored (KIP-890's verification)."""
        error = self._serves(transactional_id)
        if error is None and self._by_producer.get(producer_id) != transactional_id:
            error = ErrorCode.INVALID_TXN_STATE
        return {tp: error or self.check_produce(producer_id, producer_epoch, *tp) or ErrorCode.NONE
                for tp in partitions}

    async def verify_elsewhere(self, transactional_id: str | None, producer_id: int, producer_epoch: int,
                               tp: TopicPartition) -> ErrorCode:
        if transactional_id is None or self._others is None:
            return ErrorCode.INVALID_TXN_STATE
        return await self._others.verify(transactional_id, producer_id, producer_epoch, tp)

    def in_open_transaction(self, producer_id: int) -> bool:
        """Whether this producer id has a transaction open: its batches must then be transactional (Kafka refuses a
        plain batch from it, which would land inside the transaction's range unmarked)."""
        transactional_id = self._by_producer.get(producer_id)
        if transactional_id is None:
            return False
        meta = self.states.get(transactional_id)
        return meta is not None and meta.producer_id == producer_id and meta.state is TxnState.ONGOING

    # ---- timeouts and expiry

    async def _expiry_loop(self) -> None:
        interval = self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire()
            except Exception:
                log.exception("transaction timeout check failed")

    async def expire(self) -> None:
        """Abort transactions open past their timeout (fencing their producers); forget ids idle past
        transactional.id.expiration.ms."""
        now = _now_ms()
        for transactional_id in list(self.states):
            meta = self.states.get(transactional_id)  # now, not before the last one's awaits: it may have moved on
            if meta is None or meta.pending:
                continue
            if meta.state is TxnState.ONGOING and now - meta.start_ms > meta.timeout_ms:
                log.info("transaction %s of producer %d epoch %d timed out after %d ms: aborting",
                         meta.transactional_id, meta.producer_id, meta.producer_epoch, meta.timeout_ms)
                await self._abort_fenced(meta)
            elif meta.state.complete and now - meta.update_ms > self.config.transactional_id_expiration_ms:
                await self._forget(meta)

    async def _forget(self, meta: TxnMetadata) -> None:
        dead = _copy(meta, state=TxnState.DEAD)
        record = dead.to_record()
        record.deleted = True
        state_log = self._log_of(meta.transactional_id)
        if state_log is None:
            return
        meta.pending = True
        try:
            await state_log.append(record)
        except (ManagedLedgerError, OSError) as exc:
            log.error("transaction %s: could not expire: %s", meta.transactional_id, exc)
            return
        finally:
            meta.pending = False
        if self.states.get(meta.transactional_id) is meta:
            del self.states[meta.transactional_id]
            self._by_producer.pop(meta.producer_id, None)
            log.info("transactional id %s expired", meta.transactional_id)


def _txn_offsets_error(meta: TxnMetadata | None, producer_id: int, producer_epoch: int,
                       group_id: str) -> ErrorCode | None:
    """Why a TxnOffsetCommit does not fit the transaction it names, if it does not."""
    if meta is None or meta.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if meta.producer_epoch != producer_epoch:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if meta.pending:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
        return ErrorCode.INVALID_TXN_STATE
    return None
