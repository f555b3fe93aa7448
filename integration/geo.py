"""Helpers for geo-replication tests: several `kop standalone` processes on loopback, each a named cluster, that
know each other through the clusters registry and replicate public/default to one another."""
import time
from collections.abc import Callable, Iterable

from integration.broker_process import BrokerProcess
from integration.idem_raw import RawKafka, StoredRecord
from kop.admin.client import AdminClient, cluster_resource, namespace_resource, topic_resource

NAMESPACE = "public/default"


def start_clusters(tmp_path, names: Iterable[str], config: dict[str, str] | None = None) -> dict[str, BrokerProcess]:
    """One broker per cluster name, with the admin API, every cluster registered in every other."""
    brokers = {}
    for name in names:
        broker = BrokerProcess(str(tmp_path / f"data-{name}"), admin_port=0, options=("--cluster-name", name),
                               config=dict(config or {}))
        brokers[name] = broker.start()
    for broker in brokers.values():
        register(broker, brokers)
    return brokers


def register(broker: BrokerProcess, brokers: dict[str, BrokerProcess]) -> None:
    admin = AdminClient(broker.admin_url)
    for name, other in brokers.items():
        admin.put(cluster_resource(name), {"brokerServiceUrl": other.bootstrap, "serviceUrl": other.admin_url})


def replicate(broker: BrokerProcess, clusters: list[str]) -> None:
    AdminClient(broker.admin_url).post(namespace_resource(NAMESPACE, "replication"), clusters)


def replicate_everywhere(brokers: dict[str, BrokerProcess], topic: str, partitions: int) -> None:
    """Every cluster replicates public/default to every other, and holds `topic` with `partitions`."""
    for broker in brokers.values():
        replicate(broker, list(brokers))
        with RawKafka(broker.port) as kafka:
            error = kafka.create_topic(topic, partitions)
            assert error == 0, f"creating {topic} failed with error {error}"


def topic_stats(broker: BrokerProcess, topic: str) -> dict:
    return AdminClient(broker.admin_url).get(topic_resource(topic, "stats"))


def end_offsets(broker: BrokerProcess, topic: str, partitions: int) -> dict[int, int]:
    with RawKafka(broker.port) as kafka:
        return kafka.end_offsets(topic, range(partitions))


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (OSError, RuntimeError):  # not there yet (a topic not created, a broker restarting)
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_for_records(broker: BrokerProcess, topic: str, partitions: int, count: int, timeout: float = 60.0) -> None:
    """Until the topic's partitions hold `count` offsets in total (replicated entries keep their record counts)."""
    wait_for(lambda: sum(end_offsets(broker, topic, partitions).values()) >= count, timeout,
             f"{count} records in {topic} on port {broker.port}")


def by_source(records: list[StoredRecord]) -> dict[str, list[StoredRecord]]:
    """Records grouped by the value prefix `source:` their test producer gave them."""
    out: dict[str, list[StoredRecord]] = {}
    for record in records:
        out.setdefault(record.value.split(b":", 1)[0].decode(), []).append(record)
    return out
