"""Namespace and topic policies, resolved topic -> namespace -> broker as in Pulsar. On the file engine they are
stored in one protobuf record (`<data>/policies`) replaced atomically on every change; on the PostgreSQL engine in
the database, one record per namespace or topic, shared by every broker of the cluster (each reads them again every
heartbeat: `reload`)."""
import asyncio
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kop.config import BrokerConfig
from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import Policies, PolicyStore

if TYPE_CHECKING:
    from kop.groups.generations import RecordStore

log = logging.getLogger(__name__)
RECORD_KINDS = {"namespace": "policy-namespace", "topic": "policy-topic"}  # in the database's record store

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
        self._records: "RecordStore | None" = None  # the database's (PostgreSQL engine), else the file
        # One change or reload at a time: a reload that read the database before a change was stored would put the
        # old policies back in memory after it, and two changes of one namespace would each start from the old one.
        self._changing = asyncio.Lock()

    def load(self) -> None:
        """The file's policies (the file engine's, or those a broker had before it moved to the database)."""
        if not os.path.exists(self.path):
            return
        store = PolicyStore()
        with open(self.path, "rb") as f:
            store.ParseFromString(f.read())
        self.namespaces = {e.name: e.policies for e in store.namespaces}
        self.topics = {e.name: e.policies for e in store.topics}

    async def share_through(self, records: "RecordStore") -> None:
        """Keep the policies in the database from now on (after `load`). A database that holds none yet takes the
        ones this broker had in its file, so moving to PostgreSQL keeps them."""
        self._records = records
        carried = {"namespace": dict(self.namespaces), "topic": dict(self.topics)}
        await self.reload()
        if not self.namespaces and not self.topics and any(carried.values()):
            for level, book in carried.items():
                for name, policies in book.items():
                    await records.put_record(RECORD_KINDS[level], name, policies.SerializeToString())
            log.info("policies of %s copied into the database", self.path)
            await self.reload()

    async def reload(self) -> bool:
        """Read the database's policies again (another broker may have changed them); whether they changed."""
        if self._records is None:
            return False
        async with self._changing:
            return await self._reload()

    async def _reload(self) -> bool:
        found = {level: {name: Policies.FromString(value) for name, value in
                         (await self._records.records(kind)).items()} for level, kind in RECORD_KINDS.items()}
        changed = found["namespace"] != self.namespaces or found["topic"] != self.topics
        self.namespaces, self.topics = found["namespace"], found["topic"]
        return changed

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

    async def set(self, level: str, name: str, field: str, value) -> None:
        """Set one field (value None removes it, falling back to the next level); durable once it returns."""
        if field not in FIELDS:
            raise KeyError(field)
        async with self._changing:
            book = self.namespaces if level == "namespace" else self.topics
            policies = Policies()
            policies.CopyFrom(book.get(name, Policies()))
            if value is None:
                policies.ClearField(field)
            elif field in LIST_FIELDS:
                getattr(policies, field).names[:] = list(value)
            else:
                setattr(policies, field, value)
            await self._store(level, name, policies if policies.ListFields() else None)

    async def drop_topic(self, topic: str) -> None:
        async with self._changing:
            if self.topic_key(topic) in self.topics:
                await self._store("topic", self.topic_key(topic), None)

    async def _store(self, level: str, name: str, policies: Policies | None) -> None:
        """Store one namespace's or topic's policies (None: it has none left), then use them."""
        book = self.namespaces if level == "namespace" else self.topics
        if self._records is not None:
            if policies is None:
                await self._records.delete_record(RECORD_KINDS[level], name)
            else:
                await self._records.put_record(RECORD_KINDS[level], name, policies.SerializeToString())
        previous = book.get(name)
        if policies is None:
            book.pop(name, None)
        else:
            book[name] = policies
        if self._records is None:
            try:
                self._save()
            except OSError:
                if previous is None:
                    book.pop(name, None)
                else:
                    book[name] = previous
                raise

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
