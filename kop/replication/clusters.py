"""The clusters registry: the named clusters this broker replicates to, with where their Kafka port and admin API
are. One protobuf record (`<data>/clusters`), replaced atomically on every change, as the policies are."""
import os
import re
from dataclasses import dataclass

from kop.config_checks import HostName
from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import ClusterInfo, ClusterStore

CLUSTER_NAME = re.compile(r"[\w.-]{1,64}")


class ClusterError(ValueError):
    """A cluster definition that cannot be stored: a bad name or address."""


class UnknownCluster(ClusterError):
    pass


class ClusterExists(ClusterError):
    pass


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    broker_url: str  # HOST:PORT of its Kafka listener
    admin_url: str = ""

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.broker_url.rpartition(":")
        return host, int(port)

    def to_json(self) -> dict:
        return {"name": self.name, "brokerServiceUrl": self.broker_url, "serviceUrl": self.admin_url}


def check_cluster(name: str, broker_url: str, admin_url: str = "") -> Cluster:
    if not CLUSTER_NAME.fullmatch(name or ""):
        raise ClusterError(f"invalid cluster name {name!r}: use 1-64 of letters, digits, '.', '_' or '-'")
    if broker_url.startswith("kafka://") or broker_url.startswith("PLAINTEXT://"):
        broker_url = broker_url.split("://", 1)[1]
    host, sep, port = broker_url.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"the broker URL must be HOST:PORT of the cluster's Kafka listener, got {broker_url!r}")
    try:
        HostName(wildcard_ok=False)(host)
    except ValueError as exc:
        raise ClusterError(f"the broker URL's host: {exc}") from None
    if admin_url and not admin_url.startswith(("http://", "https://")):
        raise ClusterError(f"the admin URL must start with http:// or https://, got {admin_url!r}")
    return Cluster(name, f"{host}:{int(port)}", admin_url)


class ClusterRegistry:
    def __init__(self, data_dir: str, durable: bool) -> None:
        self.path = os.path.join(data_dir, "clusters")
        self._durable = durable
        self.clusters: dict[str, Cluster] = {}

    def load(self) -> None:
        if not os.path.exists(self.path):
            return
        store = ClusterStore()
        with open(self.path, "rb") as f:
            store.ParseFromString(f.read())
        self.clusters = {c.name: Cluster(c.name, c.broker_url, c.admin_url) for c in store.clusters}

    def get(self, name: str) -> Cluster | None:
        return self.clusters.get(name)

    def create(self, cluster: Cluster) -> None:
        if cluster.name in self.clusters:
            raise ClusterExists(f"cluster {cluster.name!r} already exists")
        self._put(cluster)

    def update(self, cluster: Cluster) -> None:
        if cluster.name not in self.clusters:
            raise UnknownCluster(f"cluster {cluster.name!r} does not exist")
        self._put(cluster)

    def delete(self, name: str) -> None:
        if self.clusters.pop(name, None) is None:
            raise UnknownCluster(f"cluster {name!r} does not exist")
        self._save()

    def _put(self, cluster: Cluster) -> None:
        self.clusters[cluster.name] = cluster
        self._save()

    def _save(self) -> None:
        store = ClusterStore(clusters=[ClusterInfo(name=c.name, broker_url=c.broker_url, admin_url=c.admin_url)
                                       for _, c in sorted(self.clusters.items())])
        replace_atomically(self.path, store.SerializeToString(), durable=self._durable)
