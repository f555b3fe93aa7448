"""Coordinators of a cluster fenced by their shard's epoch, against a real PostgreSQL: two brokers' stores on one
database, the second taking the shard over from the first, which is stale from then on and tries to write."""
import pytest

from kop.cluster.groups import shard_ledger as group_shard_ledger
from kop.cluster.transactions import shard_ledger as txn_shard_ledger, shard_ledger_config
from kop.groups.generations import CoordinatorMoved, StoredGenerations
from kop.ledger import ManagedLedgerError
from kop.ledger.postgres import PgManagedLedger, PgStore
from kop.transactions.state import TxnMetadata, TxnState
from kop.transactions.state_log import TxnStateLog
from proto.kop_pb2 import GroupGeneration


@pytest.fixture
async def stores(postgres_url):
    old, new = await PgStore(postgres_url).open(), await PgStore(postgres_url).open()
    yield old, new
    await old.close()
    await new.close()


def generations(store: PgStore, fence: tuple[str, int]) -> StoredGenerations:
    stored = StoredGenerations(store)
    stored.fence_of = lambda group_id: fence
    return stored


async def test_a_group_coordinator_that_lost_its_shard_stores_no_generation(stores):
    old, new = stores
    shard = group_shard_ledger(7)
    stale = generations(old, (shard, (await old.take_ownership(shard, 0)).row.epoch))
    await stale.record(GroupGeneration(group_id="g", generation_id=3))  # the control: stored while it holds it
    current = generations(new, (shard, (await new.take_ownership(shard, 0)).row.epoch))
    assert (await current.load())["g"].generation_id == 3  # the new coordinator learns it
    await current.record(GroupGeneration(group_id="g", generation_id=4))
    with pytest.raises(CoordinatorMoved):
        await stale.record(GroupGeneration(group_id="g", generation_id=5, protocol_type="consumer"))
    with pytest.raises(CoordinatorMoved):
        await stale.delete("g")
    assert (await StoredGenerations(new).load())["g"].generation_id == 4


async def test_a_generation_of_a_group_this_broker_does_not_coordinate_is_refused_before_any_write(stores):
    old, _new = stores
    nowhere = StoredGenerations(old)
    nowhere.fence_of = lambda group_id: None
    with pytest.raises(CoordinatorMoved):
        await nowhere.record(GroupGeneration(group_id="g", generation_id=1))
    assert await StoredGenerations(old).load() == {}


async def test_a_transaction_coordinator_that_lost_its_shard_cannot_log_and_its_successor_replays_the_decision(
        stores):
    old, new = stores
    config = shard_ledger_config(fsync=False)
    ledger = await PgManagedLedger.open(txn_shard_ledger(3), old, config)
    stale = TxnStateLog(ledger, ledger.epoch)
    ongoing = TxnMetadata("t", producer_id=7, producer_epoch=0, timeout_ms=60_000, state=TxnState.ONGOING,
                          partitions={("a", 0)})
    await stale.append(ongoing.to_record())
    deciding = TxnMetadata("t", 7, 0, 60_000, state=TxnState.PREPARE_COMMIT, partitions={("a", 0), ("b", 1)})
    await stale.append(deciding.to_record())
    taken = await PgManagedLedger.open(txn_shard_ledger(3), new, config)
    successor = TxnStateLog(taken, taken.epoch)
    assert successor.coordinator_epoch > stale.coordinator_epoch  # its markers carry the higher epoch
    replayed = successor.load()["t"]
    assert (replayed.state, replayed.partitions) == (TxnState.PREPARE_COMMIT, {("a", 0), ("b", 1)})
    aborting = TxnMetadata("t", 7, 1, 60_000, state=TxnState.PREPARE_ABORT, partitions={("a", 0)})
    with pytest.raises(ManagedLedgerError, match="another broker owns it now"):
        await stale.append(aborting.to_record())  # the stale coordinator can never undo the decision
    await successor.close()
    reopened = await PgManagedLedger.open(txn_shard_ledger(3), new, config)
    try:
        assert TxnStateLog(reopened).load()["t"].state is TxnState.PREPARE_COMMIT
    finally:
        await reopened.close()
    await stale.close()
