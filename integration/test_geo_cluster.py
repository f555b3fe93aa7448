"""Geo-replication with a cluster of brokers on PostgreSQL: east is three brokers on one database, west one broker.
A replicated group is coordinated by an east broker that owns none of the topic's partitions, so the partitions'
owners reach it only through the other brokers (PIP-33 snapshots read its offsets from its coordinator, UPDATEs
move it there), and west reaches east through that same broker, which hands each partition's entries on to its
owner. Real processes, a real PostgreSQL, real clients; east killed -9 whole, then west."""
import pytest

from integration.broker_process import BrokerProcess
from integration.geo import register, replicate, start_clusters, wait_for, wait_for_records
from integration.idem_raw import RawKafka
from integration.pg_cluster import PgCluster, coordinator
from integration.test_cluster import wait_until_served_by_leaders
from integration.test_geo_failover import FAST_SNAPSHOTS, PARTITIONS, PER_ROUND, ROUNDS, TOTAL, consume, expected
from integration.test_geo_replication import produce
from integration.test_groups_offsets import fetch_committed
from kop.admin.client import CLUSTERS_PATH, AdminClient, group_resource
from kop.cluster.groups import SHARD_TOPIC, shard_of
from kop.cluster.ownership import owner_of
from kop.topic_storage import ledger_name
from protocol.errors import ErrorCode

NODES = [1, 2, 3]


def group_coordinated_apart(topic: str) -> tuple[str, int]:
    """A group id whose coordinator, among three live brokers, owns none of the topic's partitions; that broker."""
    owners = {owner_of(ledger_name(topic, p), NODES) for p in range(PARTITIONS)}
    for i in range(1000):
        group = f"app-{i}"
        node = owner_of(ledger_name(SHARD_TOPIC, shard_of(group)), NODES)
        if node not in owners:
            return group, node
    raise AssertionError("no group id coordinated apart from the partitions' owners")


def registered(broker: BrokerProcess, names: tuple[str, ...]) -> bool:
    return all(name in AdminClient(broker.admin_url).get(CLUSTERS_PATH) for name in names)


def position(bootstrap: str, group: str) -> int:
    """The group's committed offsets in a cluster, summed over the partitions (0 while it has none)."""
    try:
        return sum(offset for (topic, _), (offset, _) in fetch_committed(bootstrap, group).items()
                   if topic == "orders" and offset >= 0)
    except Exception:  # noqa: BLE001 - a cluster still electing the group's coordinator: not there yet
        return 0


@pytest.fixture
def east_and_west(tmp_path, postgres_url):
    config = {"cluster.name": "east", **FAST_SNAPSHOTS}
    east = PgCluster(str(tmp_path / "east"), postgres_url)
    west: dict[str, BrokerProcess] = {}
    try:
        east.start(3, config)
        west = start_clusters(tmp_path, ("west",), FAST_SNAPSHOTS)
        yield east, west["west"]
    finally:
        east.stop()
        for broker in west.values():
            broker.stop()


@pytest.mark.slow  # 40-70 s: four brokers, a PostgreSQL, kills of a whole cluster, group consumers
def test_a_group_coordinated_apart_from_its_partitions_fails_over_to_the_other_cluster_and_back(east_and_west):
    east, west = east_and_west
    group, apart = group_coordinated_apart("orders")
    brokers = {"east": east.brokers[apart], "west": west}  # west reaches east through the group's coordinator
    register(east.brokers[1], brokers)  # east's registry is shared through the database, as its policies are
    wait_for(lambda: all(registered(b, ("east", "west")) for b in east.brokers.values()), 30,
             "every broker of east to know both clusters")
    register(west, {"east": brokers["east"]})  # (west has itself already)
    replicate(east.brokers[1], ["east", "west"])  # east's policies are shared through the database
    replicate(west, ["east", "west"])
    for broker in (east.brokers[1], west):
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("orders", PARTITIONS) == ErrorCode.NONE
    wait_until_served_by_leaders(east, "orders", PARTITIONS)
    wait_for(lambda: all(coordinator(east.port(n), group) == apart for n in NODES), 30, "the group's coordinator")
    assert apart not in east.leaders("orders").values()  # control: its coordinator owns none of the partitions
    AdminClient(east.brokers[apart].admin_url).post(group_resource(group, "replicated"), True)

    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, group, PER_ROUND)
    for round_ in range(1, ROUNDS):
        produce(east.bootstrap, "orders", f"east{round_}", PER_ROUND, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, TOTAL)
    in_east += consume(east.bootstrap, group, TOTAL // 2 - PER_ROUND)
    assert len(in_east) == TOTAL // 2
    # The partitions' owners read the group's offsets from its coordinator: the UPDATEs reach west.
    wait_for(lambda: position(west.bootstrap, group) >= TOTAL // 2 - PER_ROUND, 30, "the group's updates in west")
    for node in NODES:
        east.brokers[node].kill()
    in_west = consume(west.bootstrap, group, None)
    consumed = in_east + in_west
    assert set(consumed) == expected()  # no loss, no marker delivered
    duplicates = len(consumed) - TOTAL
    assert 0 <= duplicates <= PER_ROUND, f"{duplicates} duplicates after failover"

    # Fail back: west takes writes, and its UPDATEs reach east through the broker that coordinates the group and
    # owns no partition of the topic: it hands the entries on to the owners, which move the group through it.
    for node in NODES:
        east.brokers[node].start()
    east.wait_for_members(set(NODES))
    produce(west.bootstrap, "orders", "west", PER_ROUND, PARTITIONS)
    in_west += consume(west.bootstrap, group, PER_ROUND)
    wait_for(lambda: position(east.bootstrap, group) >= TOTAL + PER_ROUND // 2, 60, "the group's updates in east")
    produce(west.bootstrap, "orders", "late", 10, PARTITIONS)  # not consumed in west: the group reads it in east
    wait_for(lambda: len(east.read("orders", range(PARTITIONS))) >= TOTAL + PER_ROUND + 10, 30,
             "west's records in east")
    west.kill()
    back = consume(east.bootstrap, group, None)
    everything = expected() | {f"{source}:{i}".encode() for source, count in (("west", PER_ROUND), ("late", 10))
                               for i in range(count)}
    assert set(in_east + in_west + back) == everything
    assert len(back) <= PER_ROUND + 10, f"{len(back)} records again after failing back"
