"""Topics and their partitions: names, creation, deletion, and where their managed ledgers live.

Kafka topic T lives in namespace public/default (configurable); partition p is the managed ledger
`T-partition-p`. Topic metadata and ledgers are kept by a TopicStorage (kop/topic_storage.py): files under the data
directory, or PostgreSQL. The metadata record is a topic's commit point (see there).
"""
import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dedup import DedupConfig
from kop import internal_topics
from kop.bounded import each_bounded
from kop.compaction.settings import DEFAULTS as COMPACTION_DEFAULTS
from kop.compaction.settings import check as check_compaction_config
from kop.config import BrokerConfig
from kop.ledger import LedgerConfig, ManagedLedgerError
from kop.ledger.file_pool import OUT_OF_DESCRIPTORS, FilePool, capacity_for_open_files_limit
from kop.ledger.flusher import Flusher
from kop.ledger.postgres.entry_cache import EntryCache
from kop.ledger.postgres.store import DATABASE_ERRORS
from kop.partition import MarkerListener, PartitionLog
from kop.policies import PolicyBook
from kop.producer_ids import SharedProducerIds
from kop.startup import reading
from kop.topic_storage import (FileTopicStorage, PgTopicStorage, TopicStorage, is_postgres_url,
                               ledger_name)
from kop.transactions.index_cache import IndexCache
from protocol.errors import ErrorCode
from proto.kop_pb2 import KeyValue, TopicMetadata

log = logging.getLogger(__name__)

LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
INTERNAL_PREFIX = "__"
# How many of a topic's new partitions are opened at once. On PostgreSQL each open is several round trips (drop any
# leftovers, take ownership, read back), mostly waiting: one after another, 2,000 partitions took ~22 s with the
# connection pool idle. Bounded so that a large topic neither queues thousands of tasks on the pool (POOL_SIZE
# connections) nor, on the file engine, opens thousands of ledger files at once.
OPEN_CONCURRENCY = 16

# Topic configs we accept on CreateTopics and report in DescribeConfigs, with their defaults (Kafka's names).
TOPIC_CONFIG_DEFAULTS = {
    "cleanup.policy": "delete",
    "retention.ms": None,  # broker default
    "retention.bytes": None,
    "max.message.bytes": None,
    "message.timestamp.type": "CreateTime",
    "segment.bytes": None,  # broker default log.segment.bytes
    "segment.ms": None,  # broker default log.roll.ms
    "min.insync.replicas": "1",
    "compression.type": "producer",
}

# Kafka topic configs that kop stores and reports but does not act on (replication, segment and index tuning,
# tiered storage): tools and frameworks set them, and Kafka would accept them. The compaction configs are
# kop/compaction/settings.py's.
STORED_ONLY_TOPIC_CONFIGS = frozenset({
    "file.delete.delay.ms", "flush.messages", "flush.ms", "index.interval.bytes",
    "follower.replication.throttled.replicas", "leader.replication.throttled.replicas", "local.retention.bytes",
    "local.retention.ms", "message.downconversion.enable", "message.format.version",
    "message.timestamp.after.max.ms", "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms",
    "preallocate", "remote.storage.enable",
    "segment.index.bytes", "segment.jitter.ms", "unclean.leader.election.enable",
})
INTEGER_TOPIC_CONFIGS = frozenset({"retention.ms", "retention.bytes", "max.message.bytes", "segment.bytes",
                                   "segment.ms", "min.insync.replicas"})
MIN_TOPIC_CONFIG_VALUES = {"segment.bytes": 14, "segment.ms": 1}  # Kafka's lower bounds
COMPRESSION_TYPES = frozenset({"producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"})


def validate_topic_configs(configs: dict[str, str]) -> None:
    for key, value in configs.items():
        if key not in TOPIC_CONFIG_DEFAULTS and key not in STORED_ONLY_TOPIC_CONFIGS and key not in COMPACTION_DEFAULTS:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key!r}")
        if key in COMPACTION_DEFAULTS and (problem := check_compaction_config(key, value)):
            raise TopicError(ErrorCode.INVALID_CONFIG, problem)
        if key == "message.timestamp.type" and value not in ("CreateTime", "LogAppendTime"):
            raise TopicError(ErrorCode.INVALID_CONFIG, f"{key} must be CreateTime or LogAppendTime")
        # An empty list is accepted, as Kafka 4.x accepts it: neither deletion nor compaction.
        if key == "cleanup.policy" and not {v.strip() for v in value.split(",") if v.strip()} <= {"delete", "compact"}:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"{key} must be delete, compact, both or empty, got {value!r}")
        if key == "compression.type" and value not in COMPRESSION_TYPES:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"{key} must be one of {sorted(COMPRESSION_TYPES)}")
        if key == "min.insync.replicas" and value != "1":
            raise TopicError(ErrorCode.INVALID_CONFIG, f"{key} must be 1 on a single broker, got {value!r}")
        if key in INTEGER_TOPIC_CONFIGS:
            try:
                number = int(value)
            except (TypeError, ValueError):
                raise TopicError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer, got {value!r}") from None
            if number < MIN_TOPIC_CONFIG_VALUES.get(key, number):
                raise TopicError(ErrorCode.INVALID_CONFIG, f"{key} must be at least {MIN_TOPIC_CONFIG_VALUES[key]}")


def deletes_by_retention(configs: dict[str, str]) -> bool:
    """A topic whose policy lacks delete is never trimmed by retention: compact only (kop/compaction keeps the
    latest record per key), or an empty policy (neither, as in Kafka 4.x)."""
    return "delete" in configs.get("cleanup.policy", "delete").split(",")


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """A topic's configs as the produce path and the ledgers act on them: parsed, with the broker's defaults filled
    in, once whenever the configs change rather than on every batch."""

    max_message_bytes: int  # the largest record batch accepted
    compacted: bool  # `compact` in cleanup.policy: every record needs a key, and the log cleaner compacts it
    log_append_time: bool  # message.timestamp.type=LogAppendTime
    segment_bytes: int  # a ledger rolls at this size ...
    segment_ms: int  # ... or this age

    @classmethod
    def parse(cls, configs: dict[str, str], broker: BrokerConfig) -> "TopicSettings":
        compacted = "compact" in configs.get("cleanup.policy", "delete").split(",")
        segment_ms = int(configs.get("segment.ms", broker.ledger_max_age_ms))
        if compacted:  # as Kafka (KIP-354): the current ledger is never cleaned, so it rolls by max.compaction.lag.ms
            segment_ms = min(segment_ms, int(configs.get("max.compaction.lag.ms", COMPACTION_DEFAULTS[
                "max.compaction.lag.ms"])))
        return cls(max_message_bytes=int(configs.get("max.message.bytes", broker.message_max_bytes)),
                   compacted=compacted,
                   log_append_time=configs.get("message.timestamp.type") == "LogAppendTime",
                   segment_bytes=int(configs.get("segment.bytes", broker.ledger_max_bytes)),
                   segment_ms=segment_ms)


@dataclass
class Topic:
    name: str
    topic_id: bytes
    configs: dict[str, str]  # the overrides as stored and described (Kafka's names, string values)
    settings: TopicSettings  # the same, parsed; replaced together with configs
    slots: list[PartitionLog | None] = field(default_factory=list)  # by index; None: another broker owns it

    @property
    def partitions(self) -> list[PartitionLog]:
        """The partitions this broker owns: all of them on one broker, its share in a cluster (kop/cluster)."""
        return [p for p in self.slots if p is not None]

    @property
    def count(self) -> int:
        """How many partitions the topic has, wherever they are served."""
        return len(self.slots)

    def partition(self, index: int) -> PartitionLog | None:
        """Partition `index` when this broker owns it."""
        return self.slots[index] if 0 <= index < len(self.slots) else None


def unknown_topic(name: str) -> "TopicError":
    """The error for a topic kop holds no log for (an internal topic's is a refusal that says why)."""
    if internal_topics.is_internal(name):
        return TopicError(internal_topics.REFUSED, internal_topics.REFUSAL)
    return TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")


def validate_topic_name(name: str | None) -> None:
    if not name or name in (".", "..") or not LEGAL_TOPIC.match(name):
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"invalid topic name {name!r}: use 1-249 of [a-zA-Z0-9._-], not '.' or '..'")


class TopicManager:
    def __init__(self, config: BrokerConfig, policies: PolicyBook,
                 flush_observer: Callable[[float, int], None] | None = None) -> None:
        """flush_observer(seconds, entries): told of every ledger's group-commit fsync (the metrics)."""
        self.config = config
        self.policies = policies
        self._dedup_config = DedupConfig(
            entries_interval=config.broker_deduplication_entries_interval,
            snapshot_interval_seconds=config.broker_deduplication_snapshot_interval_seconds,
            max_producers=config.broker_deduplication_max_number_of_producers)
        ns = config.namespace.strip("/")
        ledger_config = LedgerConfig(max_ledger_bytes=config.ledger_max_bytes,
                                         max_entry_bytes=max(config.socket_request_max_bytes, 1 << 20),
                                         fsync=config.fsync, flush_observer=flush_observer)
        self._files = FilePool(capacity_for_open_files_limit())  # every partition's ledger files share it
        self.index_cache = IndexCache(config.transaction_index_cache_bytes)  # closed ledgers' aborted indexes
        # cursor logs' fsyncs and held flushes (a failpoint) run here; enough threads that one slow partition does not
        # hold up the others
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fsync")
        self._flusher = Flusher()  # every ledger's group-commit fsyncs
        self._storage: TopicStorage = (
            PgTopicStorage(config.storage, ns, ledger_config,
                           None if config.managed_ledger_cache_bytes == -1 else config.managed_ledger_cache_bytes)
            if is_postgres_url(config.storage)
            else FileTopicStorage(config.data_dir, ns, ledger_config, self._executor, self._files, self._flusher))
        self.topics: dict[str, Topic] = {}
        self._names_by_id: dict[bytes, str] = {}
        self._lock = asyncio.Lock()
        self.load_progress = (0, 0)  # (partitions loaded, partitions to load) by load_all
        self.storage_open = False  # load_all has opened the storage and read the topic list
        self._owns: Callable[[str, int], bool] = lambda topic, partition: True  # one broker owns everything
        self.marker_listener: MarkerListener | None = None  # given to every partition opened (geo-replication)
        self.shared_producer_ids = SharedProducerIds()  # ... and this (kept current by the replication service)
        # Idempotent batches answered NOT_LEADER_OR_FOLLOWER for a partition this broker owns but has not opened
        # yet (taking it over): (topic, partition) -> producer id -> (epoch, first sequence, last sequence)
        self._refused_before_open: dict[tuple[str, int], dict[int, tuple[int, int, int]]] = {}

    # ---- loading

    @property
    def entry_cache(self) -> EntryCache | None:
        """The entries' bytes held for reads (the PostgreSQL engine's cache); None for the file engine."""
        return self._storage.entry_cache

    async def open_storage(self) -> None:
        await self._storage.start()

    async def load_all(self, owns: Callable[[str, int], bool] | None = None) -> None:
        """Read every topic and open the partitions this broker owns (`owns(topic, partition)`: all by default)."""
        if owns is not None:
            self._owns = owns
        metas = await self._storage.load_metadata()
        await self._storage.remove_orphans({meta.name: meta.partitions for meta in metas})
        loaded, total = 0, sum(self._owns(meta.name, p) for meta in metas for p in range(meta.partitions))
        self.load_progress = (loaded, total)
        self.storage_open = True
        for meta in metas:
            configs = {kv.key: kv.value for kv in meta.configs}
            topic = Topic(meta.name, meta.topic_id or uuid.uuid4().bytes, configs, self._settings(configs))
            for p in range(meta.partitions):
                if not self._owns(meta.name, p):
                    topic.slots.append(None)
                    continue
                if self.config.test_partition_load_delay_ms:  # a slow disk, for tests of readiness
                    await asyncio.sleep(self.config.test_partition_load_delay_ms / 1000)
                with reading(self._storage.where(meta.name, p)):
                    topic.slots.append(await self._open_partition(meta.name, p))
                loaded += 1
                self.load_progress = (loaded, total)
            self._apply_configs(topic)
            self.topics[meta.name] = topic
            self._names_by_id[topic.topic_id] = meta.name
        log.info("loaded %d topics", len(self.topics))

    async def _open_partition(self, topic: str, partition: int, new: bool = False) -> PartitionLog:
        """Open the partition's managed ledger and recover its dedup state before it takes any write. A new
        partition starts from an empty directory, whatever an earlier topic of the same name left there."""
        name = ledger_name(topic, partition)
        ledger = await self._storage.open_ledger(topic, partition, new)
        log_ = PartitionLog(topic, partition, ledger, self._dedup_config,
                            system_topic=topic.startswith(INTERNAL_PREFIX), index_cache=self.index_cache,
                            max_aborted_per_ledger=self.config.transaction_index_max_aborted_per_ledger)
        log_.marker_listener = self.marker_listener
        log_.shared_producer_ids = self.shared_producer_ids
        try:
            if not new:
                started = time.monotonic()
                read = await log_.load_transactions()
                if read >= 10_000:
                    log.info("%s: transactions rebuilt from %d entries in %.2f s", name, read,
                             time.monotonic() - started)
            await log_.apply_dedup_policy(self.policies.resolve(topic).deduplication_enabled)
        except BaseException:
            await log_.close()
            raise
        return log_

    async def _open_new_partitions(self, topic: str, first: int, end: int) -> list[PartitionLog | None]:
        """Partitions first..end-1 of a topic being created or grown, all or none: when one cannot be opened (out of
        file descriptors, disk full) those opened are closed and removed and the request fails with an error code.
        Out of descriptors, the pool's idle files are closed and it is tried once more first."""
        try:
            try:
                return await self._open_all_or_none(topic, first, end)
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS or not self._files.shed():
                    raise
            return await self._open_all_or_none(topic, first, end)
        except (OSError, ManagedLedgerError, *DATABASE_ERRORS) as exc:  # e.g. this broker's lease ran out
            log.error("topic %s: partitions %d-%d not created: %s", topic, first, end - 1, exc)
            raise TopicError(ErrorCode.KAFKA_STORAGE_ERROR, f"partitions of {topic!r} could not be created: "
                                                            f"{getattr(exc, 'strerror', None) or exc}") from exc

    async def _open_all_or_none(self, topic: str, first: int, end: int) -> list[PartitionLog | None]:
        """The new partitions this broker owns, opened; None for those another broker owns, whose leftovers are
        removed here so that broker opens them empty once it reads the topic. Opened OPEN_CONCURRENCY at a time;
        when one fails, none is started after it, those being opened finish, and every one opened is closed and
        every partition's ledger removed before the failure is raised."""
        opened: list[PartitionLog | None] = [None] * (end - first)

        async def open_one(p: int) -> None:
            if self._owns(topic, p):
                opened[p - first] = await self._open_partition(topic, p, new=True)
            else:
                await self._storage.remove_ledger(topic, p)

        try:
            await each_bounded(range(first, end), open_one, OPEN_CONCURRENCY)
        except Exception:  # noqa: BLE001 - whatever failed, no partition of the request stays
            for partition in opened:
                if partition is not None:
                    await partition.close()
            await each_bounded(range(first, end), lambda p: self._storage.remove_ledger(topic, p), OPEN_CONCURRENCY)
            raise
        return opened

    async def apply_policies(self, topic: str | None = None) -> None:
        """Bring partitions in line with the current policies (after an admin change)."""
        names = [topic] if topic is not None else list(self.topics)
        for name in names:
            t = self.topics.get(name)
            if t is None:
                continue
            enabled = self.policies.resolve(name).deduplication_enabled
            for partition in t.partitions:
                await partition.apply_dedup_policy(enabled)

    def all_partitions(self) -> list[PartitionLog]:
        return [p for t in list(self.topics.values()) for p in t.partitions]

    def _settings(self, configs: dict[str, str]) -> TopicSettings:
        return TopicSettings.parse(configs, self.config)

    def reconfigure(self, config: BrokerConfig) -> None:
        """The broker's settings changed at run time (kop/dynamic): topics act on the new defaults of the configs
        they do not override (segment size and age, the largest batch), and new topics get the new ones."""
        self.config = config
        for topic in self.topics.values():
            settings = self._settings(topic.configs)
            if settings != topic.settings:
                topic.settings = settings
                self._apply_configs(topic)

    def _apply_configs(self, topic: Topic) -> None:
        """Push the topic's settings that partitions and their ledgers act on into its partitions."""
        settings = topic.settings
        for partition in topic.partitions:
            partition.log_append_time = settings.log_append_time
            partition.ledger.set_rollover(settings.segment_bytes, settings.segment_ms)

    async def _write_meta(self, topic: Topic) -> None:
        await self._storage.write_metadata(TopicMetadata(
            name=topic.name, partitions=topic.count, topic_id=topic.topic_id,
            created_ms=int(time.time() * 1000), configs=[KeyValue(key=k, value=v) for k, v in topic.configs.items()]))

    @property
    def storage(self) -> TopicStorage:
        return self._storage

    @property
    def file_pool(self) -> FilePool:
        return self._files

    # ---- lookups

    def name_of(self, topic_id: bytes) -> str | None:
        """The topic with this id (Fetch v13+ and DeleteTopics v6 name topics by id)."""
        return self._names_by_id.get(topic_id)

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def partition(self, name: str, index: int) -> PartitionLog | None:
        """The partition when this broker has it (None: unknown, or another broker owns it)."""
        topic = self.topics.get(name)
        return None if topic is None else topic.partition(index)

    def refused_before_open(self, name: str, index: int, producer_id: int, epoch: int, first: int, last: int
                            ) -> None:
        """An idempotent batch for a partition this broker owns but has not opened yet was answered
        NOT_LEADER_OR_FOLLOWER. Once the partition is open, the producer's batches pipelined behind it get the same
        answer until it resends it: OUT_OF_ORDER_SEQUENCE_NUMBER there would make librdkafka bump its epoch and
        resend, under the new one, records whose earlier write was stored but not acknowledged (duplicates)."""
        if not self._owns(name, index):
            return
        refused = self._refused_before_open.setdefault((name, index), {})
        earlier = refused.get(producer_id)
        if earlier is not None and earlier[0] == epoch:
            first, last = min(first, earlier[1]), max(last, earlier[2])
        refused[producer_id] = (epoch, first, last)

    def missing_partition_error(self, name: str, index: int) -> ErrorCode:
        """Why `partition(name, index)` is None: another broker owns it (clients refresh their metadata and follow
        it there), or kop has no such partition."""
        topic = self.topics.get(name)
        if topic is not None and 0 <= index < topic.count:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return internal_topics.missing_partition_error(name)

    async def get_or_create(self, name: str) -> Topic | None:
        """The topic, auto-created with the default partition count when enabled (as Kafka's Metadata/Produce do)."""
        topic = self.topics.get(name)
        if topic is not None or not self.config.auto_create_topics or name.startswith(INTERNAL_PREFIX):
            return topic
        try:
            return await self.create(name, self.config.num_partitions, {})
        except TopicError as exc:
            if exc.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return self.topics.get(name)
            raise

    # ---- admin operations

    def check_create(self, name: str, partitions: int, configs: dict[str, str]) -> int:
        validate_topic_name(name)
        if name in self.topics or internal_topics.is_internal(name):
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if partitions == -1:
            partitions = self.config.num_partitions
        if not 1 <= partitions <= self.config.max_partitions_per_topic:
            raise TopicError(ErrorCode.INVALID_PARTITIONS,
                             f"partition count must be 1..{self.config.max_partitions_per_topic}, got {partitions}")
        validate_topic_configs(configs)
        return partitions

    async def create(self, name: str, partitions: int, configs: dict[str, str]) -> Topic:
        async with self._lock:
            partitions = self.check_create(name, partitions, configs)
            topic = Topic(name, uuid.uuid4().bytes, dict(configs), self._settings(configs))
            topic.slots.extend(await self._open_new_partitions(name, 0, partitions))
            await self._write_meta(topic)
            self._apply_configs(topic)
            self.topics[name] = topic
            self._names_by_id[topic.topic_id] = name
            log.info("created topic %s with %d partitions", name, partitions)
            return topic

    async def delete(self, name: str) -> None:
        async with self._lock:
            topic = self.topics.pop(name, None)
            if topic is not None:
                self._names_by_id.pop(topic.topic_id, None)
            if topic is None:
                raise unknown_topic(name)
            for partition in topic.partitions:
                await partition.close()
            # The commit point, durable before any ledger goes: a crash after it leaves orphans that load_all
            # removes; before it, the whole topic.
            await self._storage.delete_metadata(name)
            for p in range(topic.count):
                await self._storage.remove_ledger(name, p)
            await self.policies.drop_topic(name)
            log.info("deleted topic %s", name)

    async def add_partitions(self, name: str, count: int) -> None:
        async with self._lock:
            topic = self.topics.get(name)
            if topic is None:
                raise unknown_topic(name)
            if count <= topic.count:
                raise TopicError(ErrorCode.INVALID_PARTITIONS,
                                 f"topic {name!r} has {topic.count} partitions; {count} is not more")
            if count > self.config.max_partitions_per_topic:
                raise TopicError(ErrorCode.INVALID_PARTITIONS, f"at most {self.config.max_partitions_per_topic}")
            topic.slots.extend(await self._open_new_partitions(name, topic.count, count))
            await self._write_meta(topic)
            self._apply_configs(topic)

    async def set_configs(self, name: str, configs: dict[str, str], validate_only: bool = False) -> None:
        """Replace the topic's overrides with `configs` (AlterConfigs; IncrementalAlterConfigs computes them)."""
        async with self._lock:
            topic = self.topics.get(name)
            if topic is None:
                raise unknown_topic(name)
            validate_topic_configs(configs)
            if validate_only:
                return
            topic.configs, topic.settings = dict(configs), self._settings(configs)
            await self._write_meta(topic)
            self._apply_configs(topic)
            log.info("topic %s configs now %s", name, topic.configs)

    # ---- ownership (kop/cluster): partitions come and go as brokers do

    async def sync(self) -> None:
        """Bring the topics in line with the stored ones (created, grown, reconfigured or deleted by other brokers)
        and open or close partitions as `owns` now says. A partition taken over is opened as after a crash: its
        fencing epoch rises (its earlier owner can no longer write) and its dedup state is recovered from the
        snapshot plus replay before it takes a write. The stored topics are read under the lock: read before it,
        they could miss a topic this broker created meanwhile, which would then be taken for one deleted elsewhere
        (a client told the topic was created got UNKNOWN_TOPIC_OR_PARTITION until the next heartbeat)."""
        async with self._lock:
            metas = await self._storage.load_metadata()
            stored = {meta.name: meta for meta in metas}
            for name in [name for name in self.topics if name not in stored]:
                await self._forget(name)
                log.info("topic %s was deleted by another broker", name)
            for meta in metas:
                topic = self.topics.get(meta.name)
                configs = {kv.key: kv.value for kv in meta.configs}
                if topic is not None and topic.topic_id != meta.topic_id:  # deleted and created again elsewhere
                    await self._forget(meta.name)
                    topic = None
                if topic is None:
                    topic = self.topics[meta.name] = Topic(meta.name, meta.topic_id, configs, self._settings(configs))
                    self._names_by_id[topic.topic_id] = meta.name
                elif topic.configs != configs:
                    topic.configs, topic.settings = configs, self._settings(configs)
                topic.slots.extend([None] * (meta.partitions - topic.count))
                for index in range(topic.count):
                    await self._follow_ownership(topic, index)
                self._apply_configs(topic)

    async def _follow_ownership(self, topic: Topic, index: int) -> None:
        partition, owned = topic.slots[index], self._owns(topic.name, index)
        if not owned:
            self._refused_before_open.pop((topic.name, index), None)
        if owned and partition is None:
            try:
                partition = await self._open_partition(topic.name, index)
            except Exception as exc:  # noqa: BLE001 - lease lost meanwhile, database unreachable: tried again later
                log.warning("%s: cannot take partition %d over yet: %s", topic.name, index, exc)
                return
            refused = self._refused_before_open.pop((topic.name, index), {})
            for producer_id, (epoch, first, last) in refused.items():
                partition.producers.owe(producer_id, epoch, first, last, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            topic.slots[index] = partition
            log.info("%s: took partition %d over", topic.name, index)
        elif partition is not None and not owned:
            topic.slots[index] = None
            await partition.close()
            log.info("%s: partition %d moved to another broker", topic.name, index)

    async def _forget(self, name: str) -> None:
        topic = self.topics.pop(name)
        self._names_by_id.pop(topic.topic_id, None)
        for partition in topic.partitions:
            await partition.close()

    def held_ledgers(self) -> dict[str, int]:
        """The managed ledger of each partition this broker has open, with the fencing epoch it opened it with (the
        PostgreSQL engine's: kop/cluster checks them against the stored ones)."""
        return {p.ledger.name: p.ledger.epoch for topic in self.topics.values() for p in topic.partitions}

    async def release_taken(self, stored: dict[str, int]) -> None:
        """Close the partitions whose stored epoch rose past the one this broker opened them with (`stored`: ledger
        name -> epoch, read since `held_ledgers()`): another broker took them over since, so what this one holds may
        be behind the database and none of its writes can succeed. `sync` opens again those it still owns."""
        async with self._lock:
            for topic in self.topics.values():
                for index, partition in enumerate(topic.slots):
                    if partition is not None and \
                            stored.get(partition.ledger.name, partition.ledger.epoch) > partition.ledger.epoch:
                        topic.slots[index] = None
                        await partition.close()
                        log.warning("%s: partition %d was taken over by another broker since this one opened it",
                                    topic.name, index)

    async def release_all(self) -> None:
        """Close every partition this broker owns (its lease is lost, or it leaves the cluster)."""
        async with self._lock:
            for topic in self.topics.values():
                for index, partition in enumerate(topic.slots):
                    if partition is not None:
                        topic.slots[index] = None
                        await partition.close()

    async def close(self) -> None:
        for topic in self.topics.values():
            for partition in topic.partitions:
                await partition.close()
        await self._storage.close()
        self._flusher.stop()
        self._executor.shutdown(wait=True)
