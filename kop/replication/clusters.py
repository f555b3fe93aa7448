"""The clusters registry: the named clusters this broker replicates to, with where their Kafka port and admin API
are. One protobuf record (`<data>/clusters`), replaced atomically on every change, or with the PostgreSQL engine one
record per cluster in the database, shared by every broker of the cluster (kop/shared_book.py)."""
import os
import re
from dataclasses import dataclass, field

from kop.config_checks import HostName
from kop.ledger.framed_file import replace_atomically
from kop.security.sasl import MECHANISMS as SASL_MECHANISMS
from kop.shared_book import SharedBook
from proto.kop_pb2 import ClusterInfo, ClusterStore

CLUSTER_NAME = re.compile(r"[\w.-]{1,64}")


class ClusterError(ValueError):
    """A cluster definition that cannot be stored: a bad name or address."""


class UnknownCluster(ClusterError):
    pass


class ClusterExists(ClusterError):
    pass


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True, slots=True)
class LinkSecurity:
    """How the replicators reach a cluster's Kafka listener, as a Kafka client's security settings say it."""
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)  # never logged, never shown by the admin API
    ssl_ca_file: str = ""  # the CA to trust on this broker's machine; empty: the system's

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    def to_json(self) -> dict:
        shown = {"saslMechanism": self.sasl_mechanism, "saslUsername": self.sasl_username,
                 "sslCaFile": self.ssl_ca_file}
        return {"securityProtocol": self.protocol, **{key: value for key, value in shown.items() if value}}


PLAINTEXT = LinkSecurity()


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    broker_url: str  # HOST:PORT of its Kafka listener
    admin_url: str = ""
    security: LinkSecurity = PLAINTEXT

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.broker_url.rpartition(":")
        return host, int(port)

    def to_json(self) -> dict:
        return {"name": self.name, "brokerServiceUrl": self.broker_url, "serviceUrl": self.admin_url,
                **self.security.to_json()}


def check_security(security: LinkSecurity) -> LinkSecurity:
    if security.protocol not in SECURITY_PROTOCOLS:
        raise ClusterError(f"unknown security protocol {security.protocol!r}: use one of "
                           f"{', '.join(SECURITY_PROTOCOLS)}")
    if security.sasl:
        if security.sasl_mechanism not in SASL_MECHANISMS:
            raise ClusterError(f"{security.protocol} needs a SASL mechanism, one of {', '.join(SASL_MECHANISMS)}; "
                               f"got {security.sasl_mechanism!r}")
        if not security.sasl_username or not security.sasl_password:
            raise ClusterError(f"{security.protocol} needs a SASL user name and password")
    elif security.sasl_mechanism or security.sasl_username or security.sasl_password:
        raise ClusterError(f"SASL settings given with {security.protocol}: use SASL_PLAINTEXT or SASL_SSL")
    if security.ssl_ca_file and not security.tls:
        raise ClusterError(f"a CA file given with {security.protocol}: use SSL or SASL_SSL")
    if security.ssl_ca_file and not os.access(security.ssl_ca_file, os.R_OK):
        raise ClusterError(f"the CA file {security.ssl_ca_file!r} cannot be read on this broker")
    return security


def check_cluster(name: str, broker_url: str, admin_url: str = "", security: LinkSecurity = PLAINTEXT) -> Cluster:
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
    return Cluster(name, f"{host}:{int(port)}", admin_url, check_security(security))


class ClusterRegistry(SharedBook):
    kind = "replication-cluster"

    def __init__(self, data_dir: str, durable: bool) -> None:
        super().__init__()
        self.path = os.path.join(data_dir, "clusters")
        self._durable = durable
        self.clusters: dict[str, Cluster] = {}

    def load(self) -> None:
        if not os.path.exists(self.path):
            return
        store = ClusterStore()
        with open(self.path, "rb") as f:
            store.ParseFromString(f.read())
        self.clusters = {c.name: _cluster(c) for c in store.clusters}

    def save(self) -> None:
        store = ClusterStore(clusters=[_info(c) for _, c in sorted(self.clusters.items())])
        # It holds the links' passwords: readable by this broker's user alone.
        replace_atomically(self.path, store.SerializeToString(), durable=self._durable, mode=0o600)

    def as_records(self) -> dict[str, bytes]:
        return {name: _info(c).SerializeToString(deterministic=True) for name, c in self.clusters.items()}

    def take_records(self, records: dict[str, bytes]) -> None:
        self.clusters = {name: _cluster(ClusterInfo.FromString(value)) for name, value in records.items()}

    def get(self, name: str) -> Cluster | None:
        return self.clusters.get(name)

    async def create(self, cluster: Cluster) -> None:
        await self.refresh()  # whether it exists as every broker has set it, not as of a heartbeat ago
        if cluster.name in self.clusters:
            raise ClusterExists(f"cluster {cluster.name!r} already exists")
        await self._put(cluster)

    async def update(self, cluster: Cluster) -> None:
        await self.refresh()
        if cluster.name not in self.clusters:
            raise UnknownCluster(f"cluster {cluster.name!r} does not exist")
        await self._put(cluster)

    async def delete(self, name: str) -> None:
        await self.refresh()
        if name not in self.clusters:
            raise UnknownCluster(f"cluster {name!r} does not exist")
        async with self.changing():
            self.clusters = {n: c for n, c in self.clusters.items() if n != name}

    async def _put(self, cluster: Cluster) -> None:
        async with self.changing():
            self.clusters = {**self.clusters, cluster.name: cluster}


def _info(c: Cluster) -> ClusterInfo:
    return ClusterInfo(name=c.name, broker_url=c.broker_url, admin_url=c.admin_url,
                       security_protocol=c.security.protocol, sasl_mechanism=c.security.sasl_mechanism,
                       sasl_username=c.security.sasl_username, sasl_password=c.security.sasl_password,
                       ssl_ca_file=c.security.ssl_ca_file)


def _cluster(c: ClusterInfo) -> Cluster:
    return Cluster(c.name, c.broker_url, c.admin_url, LinkSecurity(
        c.security_protocol or "PLAINTEXT", c.sasl_mechanism, c.sasl_username, c.sasl_password, c.ssl_ca_file))
