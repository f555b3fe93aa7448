"""Retention and replication between real brokers: retention never deletes what a replicator has not sent yet, so
a remote that is down while retention runs gets every record once it is back; past the backlog quota
(`replicationBacklogQuotaLimitBytes`) retention deletes them all the same and says so. A topic that does not
replicate, on the same broker, is the control that retention ran."""
import asyncio

import pytest

from integration.broker_process import BrokerProcess, storage_options
from integration.geo import register, replicate, topic_stats, wait_for, wait_for_records
from integration.idem_raw import RawKafka
from integration.test_admin import admin_change
from integration.test_geo_replication import check_everything_once, produce
from kop.ledger.postgres.store import PgStore
from kop.replication.clusters import ClusterRegistry
from protocol.errors import ErrorCode

PARTITIONS = 2
FAST_RETENTION = {"log.retention.ms": "1000", "log.retention.check.interval.ms": "200"}


def start_pair(tmp_path, east_config: dict[str, str]) -> tuple[BrokerProcess, BrokerProcess]:
    """east (fast retention) replicates `orders` to west (default retention); east's `local` stays in east."""
    brokers = {name: BrokerProcess(str(tmp_path / f"data-{name}"), admin_port=0, options=("--cluster-name", name),
                                   config=config).start()
               for name, config in (("east", east_config), ("west", {}))}
    for broker in brokers.values():
        register(broker, brokers)
    east = brokers["east"]
    replicate(east, ["east", "west"])
    with RawKafka(east.port) as kafka:
        for topic in ("orders", "local"):
            assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    admin_change(east, "topics", "set-clusters", "local", "--clusters", "east")
    return east, brokers["west"]


@pytest.fixture
def pair(tmp_path, request):
    brokers = start_pair(tmp_path, {**FAST_RETENTION, **getattr(request, "param", {})})
    yield brokers
    for broker in brokers:
        broker.stop()


async def forget_cluster(broker: BrokerProcess, name: str) -> None:
    """Delete a cluster from a stopped broker's registry where that broker keeps it, as the broker would: its file,
    or with the PostgreSQL engine the database's records (its file is then only the seed of a new database)."""
    registry = ClusterRegistry(broker.data_dir, durable=True)
    registry.load()
    storage = storage_options(broker.data_dir)
    if not storage:
        await registry.delete(name)
        return
    store = await PgStore(storage[1]).open()
    try:
        await registry.share_through(store)
        await registry.delete(name)
    finally:
        await store.close()


def offsets(broker: BrokerProcess, topic: str) -> tuple[int, int]:
    """The topic's log start and end offsets, summed over the partitions."""
    with RawKafka(broker.port) as kafka:
        starts = kafka.start_offsets(topic, range(PARTITIONS))
        ends = kafka.end_offsets(topic, range(PARTITIONS))
    return sum(starts.values()), sum(ends.values())


def west_down_while_retention_runs(east: BrokerProcess, west: BrokerProcess) -> None:
    """20 records replicated; west stopped; 100 more in east, past retention; the control topic's records deleted
    (retention ran after those 100 were due)."""
    produce(east.bootstrap, "orders", "early", 20, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 20)
    west.stop()
    produce(east.bootstrap, "orders", "late", 100, PARTITIONS)
    produce(east.bootstrap, "local", "local", 10, PARTITIONS)
    wait_for(lambda: offsets(east, "local") == (10, 10), 20, "retention to delete the control topic's records")


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_retention_keeps_what_a_replicator_has_not_sent_until_the_remote_is_back(pair):
    east, west = pair
    west_down_while_retention_runs(east, west)
    assert offsets(east, "orders")[0] <= 20  # held back at what west has
    assert topic_stats(east, "orders")["replication"]["west"]["replicationBacklog"] >= PARTITIONS
    west.start()
    wait_for_records(west, "orders", PARTITIONS, 120)
    check_everything_once(west, "orders", PARTITIONS, {"early": 20, "late": 100})
    # Sent: retention lets them go.
    wait_for(lambda: offsets(east, "orders") == (120, 120), 20, "retention to delete what was replicated")


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
@pytest.mark.parametrize("pair", [{"replicationBacklogQuotaLimitBytes": "1"}], indirect=True)
def test_a_replicator_over_the_backlog_quota_holds_nothing_back(pair):
    east, west = pair
    west_down_while_retention_runs(east, west)
    wait_for(lambda: offsets(east, "orders") == (120, 120), 20, "retention to delete what west has not got")
    assert "had not replicated yet" in east.log_tail(200)
    west.start()
    produce(east.bootstrap, "orders", "after", 10, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 30)
    check_everything_once(west, "orders", PARTITIONS, {"early": 20, "after": 10})  # the late ones never came


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_a_replicator_cursor_no_replicator_is_wanted_for_holds_nothing_back(pair):
    """east restarts with a registry that lacks west (restored from before west was added, say): the cursor of its
    replicator toward west is deleted, as Pulsar does when it loads a topic, and retention goes on."""
    east, west = pair
    produce(east.bootstrap, "orders", "early", 20, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 20)
    west.stop()
    produce(east.bootstrap, "orders", "late", 30, PARTITIONS)
    east.stop()
    asyncio.run(forget_cluster(east, "west"))
    east.start()
    wait_for(lambda: offsets(east, "orders") == (50, 50), 20, "retention to delete what west never got")
    assert "cursor pulsar.repl.west deleted" in east.log_tail(200)
