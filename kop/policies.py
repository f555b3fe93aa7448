"""Namespace and topic policies, resolved topic -> namespace -> broker as in Pulsar, stored in one protobuf record
(`<data>/policies`) replaced atomically on every change."""
import os
from dataclasses import dataclass

from kop.config import BrokerConfig
from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import Policies, PolicyStore

FIELDS = ("deduplication_enabled", "deduplication_snapshot_interval_seconds", "replication_clusters",
          "replicated_subscriptions", "message_ttl_seconds")
LIST_FIELDS = frozenset({"replication_clusters"})  # ClusterList messages, set and read as tuples of names


@dataclass(frozen=True)
class ResolvedPolicies:
    deduplication_enabled: bool
    deduplication_snapshot_interval_seconds: int
    replication_clusters: tuple[str, ...] = ()  # the clusters the topic lives in (this one among them, or not)
    replicated_subscriptions: bool = False  # every group's position is replicated (PIP-33)
    message_ttl_seconds: int = 0  # a replicator does not send records older than this (0: never)


class PolicyBook:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.path = os.path.join(config.data_dir, "policies")
        self.namespaces: dict[str, Policies] = {}
        self.topics: dict[str, Policies] = {}

    def load(self) -> None:
        if not os.path.exists(self.path):
            return
        store = PolicyStore()
        with open(self.path, "rb") as f:
            store.ParseFromString(f.read())
        self.namespaces = {e.name: e.policies for e in store.namespaces}
        self.topics = {e.name: e.policies for e in store.topics}

    def _save(self) -> None:
        store = PolicyStore(
            namespaces=[PolicyStore.Entry(name=k, policies=v) for k, v in sorted(self.namespaces.items())],
            topics=[PolicyStore.Entry(name=k, policies=v) for k, v in sorted(self.topics.items())])
        replace_atomically(self.path, store.SerializeToString(), durable=self.config.fsync)

    def topic_key(self, topic: str) -> str:
        return f"{self.config.namespace.strip('/')}/{topic}"

    def get(self, level: str, name: str) -> Policies:
        book = self.namespaces if level == "namespace" else self.topics
        return book.get(name, Policies())

    def set(self, level: str, name: str, field: str, value) -> None:
        """Set one field (value None removes it, falling back to the next level)."""
        if field not in FIELDS:
            raise KeyError(field)
        book = self.namespaces if level == "namespace" else self.topics
        policies = Policies()
        policies.CopyFrom(book.get(name, Policies()))
        if value is None:
            policies.ClearField(field)
        elif field in LIST_FIELDS:
            getattr(policies, field).names[:] = list(value)
        else:
            setattr(policies, field, value)
        if policies.ListFields():
            book[name] = policies
        else:
            book.pop(name, None)
        self._save()

    def drop_topic(self, topic: str) -> None:
        if self.topics.pop(self.topic_key(topic), None) is not None:
            self._save()

    def resolve(self, topic: str) -> ResolvedPolicies:
        levels = [self.topics.get(self.topic_key(topic)), self.namespaces.get(self.config.namespace.strip("/"))]
        broker = ResolvedPolicies(self.config.broker_deduplication_enabled,
                                  self.config.broker_deduplication_snapshot_interval_seconds,
                                  message_ttl_seconds=self.config.ttl_duration_default_in_seconds)
        values = {}
        for field in FIELDS:
            values[field] = getattr(broker, field)
            for level in levels:
                if level is not None and level.HasField(field):
                    values[field] = field_value(level, field)
                    break
        return ResolvedPolicies(**values)


def field_value(policies: Policies, field: str):
    """A field's value as set at one level (a tuple for a cluster list), None where it is not set."""
    if not policies.HasField(field):
        return None
    value = getattr(policies, field)
    return tuple(value.names) if field in LIST_FIELDS else value
