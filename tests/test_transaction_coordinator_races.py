"""The transaction coordinator when its own awaits interleave: a timeout abort against a commit, and against an
AddPartitionsToTxn waiting for its partition's first durable write. The coordinator and its state log are real;
the partitions are stand-ins whose writes finish when the test says, so each interleaving is made certain."""
import asyncio
from dataclasses import dataclass, field

from kop.config import BrokerConfig
from kop.partition import AppendResult
from kop.producer_ids import MAX_EPOCH
from kop.transactions.coordinator import TransactionCoordinator
from kop.transactions.state import TxnState
from kop.transactions.state_log import TxnStateLog
from protocol.errors import ErrorCode


@dataclass
class HeldPartition:
    """Its marker writes and its first-transaction write complete once `release` is set."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    markers: list[tuple[int, int, bool]] = field(default_factory=list)

    async def expect_transactions(self) -> None:
        await self.release.wait()

    def publish_control(self, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int = 0) -> asyncio.Future:
        async def write() -> AppendResult:
            await self.release.wait()
            self.markers.append((producer_id, producer_epoch, commit))
            return AppendResult()
        return asyncio.ensure_future(write())


class Topics:
    def __init__(self, **partitions: HeldPartition) -> None:
        self.partitions = {(name, 0): p for name, p in partitions.items()}

    def partition(self, topic: str, index: int) -> HeldPartition | None:
        return self.partitions.get((topic, index))


class Ids:
    def __init__(self) -> None:
        self.last = 100

    async def allocate(self) -> int:
        self.last += 1
        return self.last


def coordinator(tmp_path, topics: Topics) -> TransactionCoordinator:
    config = BrokerConfig(data_dir=str(tmp_path), fsync=False)
    return TransactionCoordinator(config, topics, None, Ids())


async def test_a_transaction_that_commits_while_the_timeout_check_waits_on_another_is_not_aborted(tmp_path):
    slow, quick = HeldPartition(), HeldPartition()
    quick.release.set()
    txns = coordinator(tmp_path, Topics(slow=slow, quick=quick))
    txns.start()
    try:
        _, first, first_epoch = await txns.init_producer_id("first", 1000, -1, -1)
        _, second, second_epoch = await txns.init_producer_id("second", 1000, -1, -1)
        slow.release.set()
        await txns.add_partitions("first", first, first_epoch, [("slow", 0)])
        await txns.add_partitions("second", second, second_epoch, [("quick", 0)])
        slow.release.clear()
        for transactional_id in ("first", "second"):
            txns.states[transactional_id].start_ms -= 5000  # both past their timeout
        expiry = asyncio.ensure_future(txns.expire())  # aborts "first", whose marker is held
        await asyncio.sleep(0.05)
        assert await txns.end_txn("second", second, second_epoch, True) == ErrorCode.NONE  # committed in time
        slow.release.set()
        await expiry
        assert txns.states["second"].state is TxnState.COMPLETE_COMMIT
        assert txns.states["second"].producer_epoch == second_epoch  # not fenced
        assert quick.markers == [(second, second_epoch, True)]  # one COMMIT, no ABORT after it
        assert txns.states["first"].state is TxnState.COMPLETE_ABORT  # control: the timeout abort did run
    finally:
        slow.release.set()
        await txns.stop()


async def test_an_add_partitions_overtaken_by_a_timeout_abort_does_not_undo_it(tmp_path):
    added, new = HeldPartition(), HeldPartition()
    added.release.set()
    txns = coordinator(tmp_path, Topics(added=added, new=new))
    txns.start()
    try:
        _, producer, epoch = await txns.init_producer_id("x", 1000, -1, -1)
        await txns.add_partitions("x", producer, epoch, [("added", 0)])
        txns.states["x"].start_ms -= 5000
        adding = asyncio.ensure_future(txns.add_partitions("x", producer, epoch, [("new", 0)]))  # held
        await asyncio.sleep(0.05)
        await txns.expire()  # aborts under epoch + 1 while the add waits
        new.release.set()
        assert await adding == {("new", 0): ErrorCode.CONCURRENT_TRANSACTIONS}  # the client retries, is fenced
        state = txns.states["x"]
        assert (state.state, state.producer_epoch, state.partitions) == (TxnState.COMPLETE_ABORT, epoch + 1, set())
        assert added.markers == [(producer, epoch + 1, False)]
    finally:
        new.release.set()
        await txns.stop()
    replayed = TxnStateLog.on_files(str(tmp_path), False)
    try:
        assert replayed.load()["x"].state is TxnState.COMPLETE_ABORT  # the log says the same
    finally:
        await replayed.close()


async def test_the_last_epoch_is_never_exceeded_by_a_timeout_abort_and_recovery_from_it_gets_a_new_id(tmp_path):
    partition = HeldPartition()
    partition.release.set()
    txns = coordinator(tmp_path, Topics(t=partition))
    txns.start()
    try:
        _, producer, _ = await txns.init_producer_id("x", 1000, -1, -1)
        txns.states["x"].producer_epoch = MAX_EPOCH - 1  # as after 32,766 restarts of its producer
        for _ in range(2):  # the first abort takes the last epoch, the second has none left to take
            epoch = txns.states["x"].producer_epoch
            assert await txns.add_partitions("x", producer, epoch, [("t", 0)]) == {("t", 0): ErrorCode.NONE}
            txns.states["x"].start_ms -= 5000
            await txns.expire()
            assert txns.states["x"].state is TxnState.COMPLETE_ABORT
            assert txns.states["x"].producer_epoch == MAX_EPOCH
        assert [m[1] for m in partition.markers] == [MAX_EPOCH, MAX_EPOCH]
        # The producer fenced at MAX_EPOCH - 1 recovers (KIP-360): a new id, since its own has no epoch left.
        error, new_id, new_epoch = await txns.init_producer_id("x", 1000, producer, MAX_EPOCH)
        assert (error, new_epoch) == (ErrorCode.NONE, 0) and new_id != producer
    finally:
        await txns.stop()
