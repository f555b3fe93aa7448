"""What a handler gets besides its request: the request header, the connection it came on, and the few broker
services handlers use, each typed. A handler reaches nothing else of the broker, so its dependencies are the ones
its module names through `ctx`."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kop.security.acls import CLUSTER_NAME, OPERATIONS_OF, Operation, ResourceType
from protocol.api import RequestHeader

if TYPE_CHECKING:
    from kop.admin.metrics import BrokerMetrics
    from kop.broker import Broker
    from kop.cluster import Cluster
    from kop.config import BrokerConfig
    from kop.fetch_sessions import FetchSessionCache
    from kop.groups import GroupCoordinator
    from kop.producer_ids import ProducerIdAllocator
    from kop.replication.service import ReplicationService
    from kop.security.acls import Authorizer
    from kop.security.listeners import ListenerSpec
    from kop.security.quotas import QuotaBook, QuotaMeter
    from kop.security.session import Session
    from kop.security.users import UserStore
    from kop.topics import TopicManager
    from kop.transactions.coordinator import TransactionCoordinator


@dataclass(frozen=True, slots=True)
class Endpoint:
    """This broker as clients reach it: the id, host and port Metadata, FindCoordinator and DescribeCluster name."""

    node_id: int
    host: str
    port: int
    listener: str  # the listener's name: clients are told the address of the listener they came in by


@dataclass(frozen=True, slots=True)
class BrokerServices:
    """The services handlers use, fixed once the broker listens."""

    config: "BrokerConfig"  # settings, read-only
    explicit_settings: frozenset[str]  # the config fields the operator set
    endpoint: Endpoint
    topics: "TopicManager"
    groups: "GroupCoordinator"
    producer_ids: "ProducerIdAllocator"
    transactions: "TransactionCoordinator"
    api_versions: Mapping[int, tuple[int, int]]  # api key -> (min, max) version served
    metrics: "BrokerMetrics"
    replication: "ReplicationService"
    users: "UserStore"
    authorizer: "Authorizer"
    quota_book: "QuotaBook"
    quota_meter: "QuotaMeter"
    cluster: "Cluster"  # who leads each partition, the live brokers
    fetch_sessions: "FetchSessionCache"

    @classmethod
    def of(cls, broker: "Broker", listener: "ListenerSpec") -> "BrokerServices":
        config = broker.config
        assert broker.producer_ids is not None and broker.transactions is not None and broker.cluster is not None, \
            "the broker serves requests only once started"
        endpoint = Endpoint(config.node_id, listener.advertised_host, broker.advertised_port(listener), listener.name)
        return cls(config, broker.explicit_settings, endpoint, broker.topics,
                   broker.groups, broker.producer_ids, broker.transactions, broker.api_router.versions,
                   broker.metrics, broker.replication, broker.users, broker.authorizer,
                   broker.quota_book, broker.quota_meter, broker.cluster, broker.fetch_sessions)


@dataclass(slots=True)  # not frozen: built for every request, and a frozen dataclass's __init__ costs several times more
class RequestContext:
    services: BrokerServices
    header: RequestHeader
    peer: str
    connection_id: int
    # `extra=` for a log line about this request: who sent it (the client id and the client's address)
    log_fields: Mapping[str, str]
    session: "Session"  # the connection's security state: its principal, an authentication under way

    @property
    def principal(self) -> str:
        return self.session.principal

    @property
    def quota_book(self) -> "QuotaBook":
        return self.services.quota_book

    def throttle(self, key: str, size: int) -> int:
        """throttle_time_ms this request earns by moving `size` bytes under quota `key` (user and client id)."""
        return self.services.quota_meter.record(key, self.session.principal.partition(":")[2], self.client_id,
                                                size)

    @property
    def authorizer(self) -> "Authorizer":
        return self.services.authorizer

    @property
    def client_host(self) -> str:
        return self.peer.rpartition(":")[0] or self.peer

    def authorized(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """May this request's principal do `operation` on the resource (always, without the authorizer)."""
        authorizer = self.services.authorizer
        if not authorizer.enabled:  # every produce asks: answer without building its arguments
            return True
        return authorizer.authorize(self.session.principal, self.client_host, operation, resource_type, name)

    def authorized_operations(self, resource_type: ResourceType, name: str) -> set[int]:
        """The codes of the operations this request's principal may do on the resource (KIP-430's authorized
        operations; a bit field on the wire, `operations_bits` where the field is a plain int32)."""
        return {int(op) for op in OPERATIONS_OF[resource_type] if self.authorized(op, resource_type, name)}

    def authorized_on_cluster(self, operation: Operation) -> bool:
        return self.authorized(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def may_manage_users(self, operation: Operation) -> bool:
        """Users are managed by principals with the operation on the cluster, or (no authorizer) by super users."""
        if self.authorizer.enabled:
            return self.authorized_on_cluster(operation)
        return self.authorizer.is_super_user(self.session.principal)

    @property
    def users(self) -> "UserStore":
        return self.services.users

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def client_id(self) -> str:
        return self.header.client_id or ""

    @property
    def config(self) -> "BrokerConfig":
        return self.services.config

    @property
    def endpoint(self) -> Endpoint:
        return self.services.endpoint

    @property
    def cluster(self) -> "Cluster":
        return self.services.cluster

    @property
    def topics(self) -> "TopicManager":
        return self.services.topics

    @property
    def groups(self) -> "GroupCoordinator":
        return self.services.groups

    @property
    def producer_ids(self) -> "ProducerIdAllocator":
        return self.services.producer_ids

    @property
    def transactions(self) -> "TransactionCoordinator":
        return self.services.transactions

    @property
    def api_versions(self) -> Mapping[int, tuple[int, int]]:
        return self.services.api_versions

    @property
    def metrics(self) -> "BrokerMetrics":
        return self.services.metrics
