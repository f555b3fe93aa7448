"""Dynamic broker configs (kop/dynamic) on brokers sharing one PostgreSQL database, as Kafka keeps them in its
metadata: the cluster-wide default one broker sets is put in force by every broker within a heartbeat, a broker's own
level by that broker alone, and both survive kill -9 of every broker."""
import pytest

from integration.broker_configs import SET, alter, auto_create, describe
from integration.pg_cluster import PgCluster
from integration.waiting import wait_for
from protocol.errors import ErrorCode


@pytest.fixture
def cluster(tmp_path, postgres_url):
    made = PgCluster(str(tmp_path), postgres_url)
    yield made
    made.stop()


def source(port: int, node: int, key: str) -> str:
    return describe(port, str(node))[1][key]["source"]


@pytest.mark.slow  # two brokers, a heartbeat to wait for, and both restarted
def test_the_default_reaches_every_broker_and_a_brokers_own_level_only_itself(cluster):
    cluster.start(2)
    assert alter(cluster.port(1), "", ("num.partitions", SET, "3")).error == ErrorCode.NONE
    wait_for(lambda: source(cluster.port(2), 2, "num.partitions") == "DYNAMIC_DEFAULT_BROKER_CONFIG",
             "broker 2 to read the default broker 1 set", timeout=30)
    assert auto_create(cluster.port(2), "made-by-two") == (ErrorCode.NONE, 3)
    assert alter(cluster.port(2), "2", ("num.partitions", SET, "2")).error == ErrorCode.NONE
    # a broker's level is changed through that broker, as in Kafka
    assert alter(cluster.port(1), "2", ("num.partitions", SET, "5")).error == ErrorCode.INVALID_REQUEST
    assert auto_create(cluster.port(2), "two") == (ErrorCode.NONE, 2)
    assert auto_create(cluster.port(1), "three") == (ErrorCode.NONE, 3)  # broker 2's level is not broker 1's

    for node in (1, 2):
        cluster.brokers[node].kill()
    for node in (1, 2):
        cluster.brokers[node].start()
    cluster.wait_for_members({1, 2})
    assert describe(cluster.port(1), "1")[1]["num.partitions"]["synonyms"] == [
        ("num.partitions", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG"), ("num.partitions", "1", "DEFAULT_CONFIG")]
    assert describe(cluster.port(2), "2")[1]["num.partitions"]["synonyms"] == [
        ("num.partitions", "2", "DYNAMIC_BROKER_CONFIG"), ("num.partitions", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        ("num.partitions", "1", "DEFAULT_CONFIG")]
    assert auto_create(cluster.port(1), "three-again") == (ErrorCode.NONE, 3)
