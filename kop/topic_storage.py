"""Where topics live: their metadata records and their partitions' managed ledgers, in files or in PostgreSQL.

The metadata record is a topic's commit point in both: a topic exists exactly while its record does. Deletion
removes the record before the ledgers, creation writes it after them, so a crash can leave only ledgers that belong to
no topic; `remove_orphans` removes those at start-up, and a new partition starts from nothing whatever an earlier
topic of the same name left.
"""
import logging
import os
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

from kop.ledger import LedgerConfig, FileManagedLedger, ManagedLedger
from kop.ledger.file_pool import FilePool
from kop.ledger.flusher import Flusher
from kop.ledger.framed_file import fsync_dir, makedirs_durable, replace_atomically
from kop.ledger.postgres import PgManagedLedger, PgStore
from kop.ledger.postgres.entry_cache import EntryCache
from kop.ledger.postgres.store import DATABASE_ERRORS
from kop.groups.generations import GenerationLog, StoredGenerations
from kop.producer_ids import FileProducerIdBlocks
from kop.startup import StartupError, reading
from proto.kop_pb2 import TopicMetadata

log = logging.getLogger("kop.topics")

LEDGER_NAME = re.compile(r"^(.+)-partition-(\d+)$")
TOPIC_RECORD = "topic"  # kop_record kind of the PostgreSQL engine's topic metadata


def ledger_name(topic: str, partition: int) -> str:
    return f"{topic}-partition-{partition}"


class TopicStorage(ABC):
    """One namespace's topics in one storage engine."""

    entry_cache: EntryCache | None = None  # the entries' bytes held in memory for reads, where the engine has one

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def load_metadata(self) -> list[TopicMetadata]: ...

    @abstractmethod
    async def remove_orphans(self, partitions: dict[str, int]) -> None:
        """Remove managed ledgers of no topic's partition (`partitions`: each topic's partition count)."""

    @property
    @abstractmethod
    def log_dir(self) -> str:
        """The one log directory DescribeLogDirs names: where every partition is."""

    @abstractmethod
    def space(self) -> tuple[int, int]:
        """(total, usable) bytes where the ledgers are; -1 each when unknown."""

    @abstractmethod
    def where(self, topic: str, partition: int) -> str:
        """Where a partition is stored, as start-up errors name it."""

    @abstractmethod
    async def open_ledger(self, topic: str, partition: int, new: bool) -> ManagedLedger:
        """The partition's managed ledger; a new one starts empty."""

    @abstractmethod
    async def remove_ledger(self, topic: str, partition: int) -> None: ...

    @abstractmethod
    async def write_metadata(self, meta: TopicMetadata) -> None: ...

    @abstractmethod
    async def delete_metadata(self, name: str) -> None: ...

    @abstractmethod
    def group_generations(self) -> GenerationLog | StoredGenerations:
        """Where each consumer group's latest generation is kept."""

    @abstractmethod
    def producer_id_blocks(self) -> Callable[[int], Awaitable[int]]:
        """reserve(size) of ProducerIdAllocator: where producer-id blocks are reserved (after start)."""

    async def close(self) -> None:
        """After every ledger is closed."""


class FileTopicStorage(TopicStorage):
    """`<data>/topics/<namespace>/T` holds T's metadata, `<data>/ledgers/<namespace>/T-partition-p` its ledgers."""

    def __init__(self, data_dir: str, namespace: str, config: LedgerConfig, executor: Executor,
                 files: FilePool, flusher: Flusher | None = None) -> None:
        self._producer_ids = os.path.join(data_dir, "producer-ids")
        self._generations = os.path.join(data_dir, "groups", "generations.log")
        self._meta_dir = os.path.join(data_dir, "topics", namespace)
        self._ledger_root = os.path.abspath(os.path.join(data_dir, "ledgers"))
        self._ledger_dir = os.path.join(self._ledger_root, namespace)
        self._config = config
        self._executor = executor
        self._files = files
        self._flusher = flusher  # the broker's fsync thread, shared by every ledger

    async def start(self) -> None:
        makedirs_durable(self._meta_dir, durable=self._config.fsync)
        makedirs_durable(self._ledger_dir, durable=self._config.fsync)
        with reading(self._producer_ids):
            self._blocks = FileProducerIdBlocks(self._producer_ids, durable=self._config.fsync)

    def producer_id_blocks(self) -> Callable[[int], Awaitable[int]]:
        return self._blocks.reserve

    def group_generations(self) -> GenerationLog:
        return GenerationLog(self._generations, self._config.fsync)

    async def load_metadata(self) -> list[TopicMetadata]:
        metas = []
        for name in sorted(os.listdir(self._meta_dir)):
            if name.endswith(".tmp"):
                continue
            meta = TopicMetadata()
            path = os.path.join(self._meta_dir, name)
            with reading(path), open(path, "rb") as f:
                meta.ParseFromString(f.read())
            metas.append(meta)
        return metas

    async def remove_orphans(self, partitions: dict[str, int]) -> None:
        for entry in os.listdir(self._ledger_dir):
            match = LEDGER_NAME.match(entry)
            path = os.path.join(self._ledger_dir, entry)
            if match and int(match[2]) >= partitions.get(match[1], 0) and os.path.isdir(path):
                _log_orphan(path)
                shutil.rmtree(path, ignore_errors=True)

    @property
    def log_dir(self) -> str:
        return self._ledger_root

    def space(self) -> tuple[int, int]:
        disk = os.statvfs(self._ledger_dir)
        return disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize

    def where(self, topic: str, partition: int) -> str:
        return os.path.join(self._ledger_dir, ledger_name(topic, partition))

    async def open_ledger(self, topic: str, partition: int, new: bool) -> ManagedLedger:
        directory = self.where(topic, partition)
        if new:
            shutil.rmtree(directory, ignore_errors=True)
        return FileManagedLedger.open(ledger_name(topic, partition), directory, self._config, self._executor,
                                      files=self._files, flusher=self._flusher)

    async def remove_ledger(self, topic: str, partition: int) -> None:
        shutil.rmtree(self.where(topic, partition), ignore_errors=True)

    async def write_metadata(self, meta: TopicMetadata) -> None:
        replace_atomically(os.path.join(self._meta_dir, meta.name), meta.SerializeToString(),
                           durable=self._config.fsync)

    async def delete_metadata(self, name: str) -> None:
        os.unlink(os.path.join(self._meta_dir, name))
        if self._config.fsync:
            fsync_dir(self._meta_dir)


class PgTopicStorage(TopicStorage):
    """Topic metadata as kop_record rows (kind `topic`, key `<namespace>/T`), ledgers named `<namespace>/T-partition-p`
    in the PostgreSQL engine's tables."""

    def __init__(self, url: str, namespace: str, config: LedgerConfig, entry_cache_bytes: int | None) -> None:
        self._store = PgStore(url, entry_cache_bytes)  # None: every entry's bytes held
        self.entry_cache = self._store.entry_cache
        self._prefix = namespace + "/"
        self._config = config

    async def start(self) -> None:
        where = _without_password(self._store.url)
        try:
            await self._store.open()
        except StartupError:
            raise
        except (OSError, *DATABASE_ERRORS) as exc:  # unreachable, refused, no database
            await self._store.close()
            raise StartupError(f"cannot use PostgreSQL at {where}: {exc}") from exc
        log.info("topics and ledgers in PostgreSQL at %s", where)

    @property
    def store(self) -> PgStore:
        """The database, shared with the cluster membership (kop/cluster) whose lease every write checks."""
        return self._store

    def producer_id_blocks(self) -> Callable[[int], Awaitable[int]]:
        return self._store.reserve_producer_ids

    def group_generations(self) -> StoredGenerations:
        return StoredGenerations(self._store)

    async def load_metadata(self) -> list[TopicMetadata]:
        records = await self._store.records(TOPIC_RECORD)
        return [TopicMetadata.FromString(value) for key, value in sorted(records.items())
                if key.startswith(self._prefix)]

    async def remove_orphans(self, partitions: dict[str, int]) -> None:
        for name in await self._store.names_like(self._prefix.replace("%", r"\%").replace("_", r"\_") + "%"):
            found = self.partition_of(name)
            if found is not None and found[1] >= partitions.get(found[0], 0):
                _log_orphan(name)
                await self._store.remove(name)

    @property
    def log_dir(self) -> str:
        return _without_password(self._store.url)

    def space(self) -> tuple[int, int]:
        return -1, -1  # the database's, which PostgreSQL does not tell its clients

    def where(self, topic: str, partition: int) -> str:
        return f"managed ledger {self.ledger_key(topic, partition)} in PostgreSQL"

    def ledger_key(self, topic: str, partition: int) -> str:
        """The partition's managed ledger name in the database."""
        return self._prefix + ledger_name(topic, partition)

    def partition_of(self, key: str) -> tuple[str, int] | None:
        """(topic, partition) of a managed ledger name of this namespace, None for any other."""
        match = LEDGER_NAME.match(key[len(self._prefix):]) if key.startswith(self._prefix) else None
        return (match[1], int(match[2])) if match else None

    async def open_ledger(self, topic: str, partition: int, new: bool) -> ManagedLedger:
        name = self.ledger_key(topic, partition)
        if new:
            await self._store.remove(name)
        return await PgManagedLedger.open(name, self._store, self._config)

    async def remove_ledger(self, topic: str, partition: int) -> None:
        await self._store.remove(self.ledger_key(topic, partition))

    async def write_metadata(self, meta: TopicMetadata) -> None:
        await self._store.put_record(TOPIC_RECORD, self._prefix + meta.name, meta.SerializeToString())

    async def delete_metadata(self, name: str) -> None:
        await self._store.delete_record(TOPIC_RECORD, self._prefix + name)

    async def close(self) -> None:
        await self._store.close()


def _log_orphan(where: str) -> None:
    log.warning("removing %s: it belongs to no topic", where)


def _without_password(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def is_postgres_url(storage: str) -> bool:
    return storage.startswith(("postgresql://", "postgres://"))
