"""What a handler gets besides its request: the request header, the connection it came on, and the few broker
services handlers use, each typed. A handler reaches nothing else of the broker, so its dependencies are the ones
its module names through `ctx`."""
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.api import RequestHeader

if TYPE_CHECKING:
    from kop.admin.metrics import BrokerMetrics
    from kop.broker import Broker
    from kop.config import BrokerConfig
    from kop.groups import GroupCoordinator
    from kop.producer_ids import ProducerIdAllocator
    from kop.topics import TopicManager
    from kop.transactions.coordinator import TransactionCoordinator


@dataclass(frozen=True, slots=True)
class Endpoint:
    """This broker as clients reach it: the id, host and port Metadata, FindCoordinator and DescribeCluster name."""

    node_id: int
    host: str
    port: int


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

    @classmethod
    def of(cls, broker: "Broker") -> "BrokerServices":
        config = broker.config
        assert broker.producer_ids is not None and broker.transactions is not None, \
            "the broker serves requests only once started"
        return cls(config, broker.explicit_settings, Endpoint(config.node_id, config.advertised, broker.advertised_port), broker.topics,
                   broker.groups, broker.producer_ids, broker.transactions, broker.api_router.versions,
                   broker.metrics)


@dataclass(frozen=True, slots=True)
class RequestContext:
    services: BrokerServices
    header: RequestHeader
    peer: str
    connection_id: int
    # `extra=` for a log line about this request: who sent it (the client id and the client's address)
    log_fields: Mapping[str, str]

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
