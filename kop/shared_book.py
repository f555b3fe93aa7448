"""A book of settings a broker keeps whole in memory: users, ACLs, client quotas, geo-replication clusters.

With the file engine each book is one file of the data directory, replaced atomically on every change. With the
PostgreSQL engine every broker of the cluster shares one copy, as Kafka keeps them cluster-wide: each entry is a
record of the book's kind in the database, a change writes the records it touched (so changes made at once through
different brokers all hold), and each broker reads a kind again when its version moved (kop/cluster/settings.py,
every heartbeat). The first broker to use a database sets the kind up there with the entries of its file (a broker
moving to PostgreSQL keeps its users and ACLs); later ones take the database's.
"""
import abc
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

log = logging.getLogger(__name__)


class NotStored(OSError):
    """The database did not take a change (it is unreachable, or refused it)."""


class SettingsRecords(Protocol):
    """The database's side (kop/ledger/postgres/store.py)."""

    async def records(self, kind: str) -> dict[str, bytes]: ...

    async def record_versions(self) -> dict[str, int]: ...

    async def change_records(self, kind: str, puts: dict[str, bytes], deletes: list[str]) -> None: ...

    async def seed_records(self, kind: str, records: dict[str, bytes]) -> bool: ...


class SharedBook(abc.ABC):
    kind: str  # its records' kind in the database
    path: str  # its file in the data directory

    def __init__(self) -> None:
        self._db: SettingsRecords | None = None
        self._version = 0  # of the records taken from the database last
        self._lock: asyncio.Lock | None = None  # one change or reload at a time (made on the loop that shares it)

    @abc.abstractmethod
    def as_records(self) -> dict[str, bytes]:
        """Every entry as a record: key -> value."""

    @abc.abstractmethod
    def take_records(self, records: dict[str, bytes]) -> None:
        """Replace every entry by these records'."""

    @abc.abstractmethod
    def save(self) -> None:
        """Write the whole book to its file (OSError when it cannot)."""

    @property
    def shared(self) -> bool:
        return self._db is not None

    async def share_through(self, db: SettingsRecords) -> None:
        """Keep the book in the database from now on (after the file was loaded)."""
        self._lock = asyncio.Lock()
        own = self.as_records()
        if await db.seed_records(self.kind, own):
            if own:
                log.info("%d %s records of %s copied into the database", len(own), self.kind, self.path)
        self._db = db
        await self.reload(await db.record_versions())
        if own and own != self.as_records():
            log.warning("%s is not used: the database's %s records are shared by every broker on it", self.path,
                        self.kind)

    async def reload(self, versions: dict[str, int]) -> bool:
        """Read the records again if their version moved (versions: kind -> version, read before); whether it had."""
        version = versions.get(self.kind, 0)
        if self._db is None or self._lock is None or version == self._version:
            return False
        async with self._lock:
            self.take_records(await self._db.records(self.kind))
            self._version = version
        return True

    async def refresh(self) -> None:
        """Catch up with the database now rather than at the next heartbeat."""
        if self._db is not None:
            await self.reload(await self._db.record_versions())

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[None]:
        """Around a change of the entries: stores it once the block is done. Raises OSError when it could not be
        (NotStored: the database's error; the entries are then as they were)."""
        if self._db is None:
            yield
            self.save()
            return
        assert self._lock is not None
        async with self._lock:
            before = self.as_records()
            yield
            after = self.as_records()
            puts = {key: value for key, value in after.items() if before.get(key) != value}
            deletes = [key for key in before if key not in after]
            if not puts and not deletes:
                return
            try:
                await self._db.change_records(self.kind, puts, deletes)
            except Exception as exc:  # the database unreachable, or refusing: nothing changed
                self.take_records(before)
                raise NotStored(f"{self.kind} not stored in the database: {exc}") from exc
            except BaseException:
                self.take_records(before)
                raise
