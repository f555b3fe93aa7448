"""PIP-6 message deduplication for one partition (Pulsar's MessageDeduplication), without I/O of its own.

Per producer name, two maps of the highest sequence id: `pushed` (set when a write is accepted, before storage) and
`persisted` (set when the write is durable; the only one snapshotted). The produce path asks `is_duplicate` before
writing and calls `record_persisted` after, synchronously and in log order. Storage is reached only through
`dedup.interfaces`; the snapshot is the properties of the `pulsar.dedup` cursor's mark-delete.

Deliberate differences from Pulsar, each closing a hazard it has:
* a snapshot is only ever taken at a position whose persist has been recorded (`last_recorded_position`), never at
  the ledger's last confirmed entry read on the side, so no snapshot claims an entry its properties lack;
* a purge never drops a name with a write in flight (pushed != persisted);
* after a recovery without a snapshot, the entry counter starts at the number of entries replayed, so replay length
  stays bounded by `entries_interval` across restarts;
* a status check that finds a transition in flight waits for it, then acts on its own request if it differs.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from dedup.interfaces import DEDUP_CURSOR_NAME, DedupCursor, DedupLedger, Position, ReplayEntry
from proto.kop_pb2 import MessageMetadata

log = logging.getLogger(__name__)


class Status(enum.Enum):
    INITIALIZED = "Initialized"
    DISABLED = "Disabled"
    RECOVERING = "Recovering"
    ENABLED = "Enabled"
    REMOVING = "Removing"
    FAILED = "Failed"


class DupStatus(enum.Enum):
    NOT_DUP = "NotDup"
    DUP = "Dup"
    UNKNOWN = "Unknown"  # at or below pushed but not yet persisted: the outcome of the first write is not known


_NOT_DUP = DupStatus.NOT_DUP  # looking up an enum member costs more than the rest of a decision


@dataclass(frozen=True, slots=True)
class DedupConfig:
    """Pulsar's broker settings of the same meaning (`brokerDeduplication*`)."""

    entries_interval: int = 1000  # persisted entries between snapshots
    snapshot_interval_seconds: float = 120.0  # default for the time check; <= 0 disables it
    max_producers: int = 10000  # cap on the names written into one snapshot


class DedupExtension(Protocol):
    """State kept beside the two maps that must be snapshotted and rebuilt with them (Kafka's producer state).

    Its snapshot properties share the cursor with the maps; it owns the keys for which `owns_property` is true.
    """

    def owns_property(self, key: str) -> bool: ...

    def reset(self) -> None:
        """Drop all state (dedup disabled, or a recovery starting)."""

    def restore(self, properties: Mapping[str, int]) -> None:
        """Load the owned snapshot properties; called after the maps are loaded, before the replay."""

    def replay(self, entry: ReplayEntry) -> None:
        """Apply one replayed entry that carries a producer name, after the maps were updated for it."""

    def snapshot_properties(self, names: Collection[str]) -> dict[str, int]:
        """Owned properties for the producer names that made it into this snapshot."""
        ...

    def forget(self, names: Collection[str]) -> None:
        """These names were purged for inactivity."""


def carries_dedup_identity(metadata: MessageMetadata) -> bool:
    """Whether an entry counts for deduplication: markers and control batches never do, nameless entries can't."""
    return bool(metadata.producer_name) and not metadata.HasField("marker_type") and not metadata.is_control


class MessageDeduplication:
    def __init__(
        self,
        ledger: DedupLedger,
        config: DedupConfig = DedupConfig(),
        *,
        system_topic: bool = False,
        clock: Callable[[], float] = time.monotonic,
        log_name: str = "",
    ) -> None:
        self._ledger = ledger
        self._config = config
        self._system_topic = system_topic
        self._clock = clock
        self._log_name = log_name
        self._extension: DedupExtension | None = None
        self._status = Status.INITIALIZED
        self._enabled = False  # status is ENABLED; read for every batch, so kept as a plain attribute
        self._cursor: DedupCursor | None = None
        self._pushed: dict[str, int] = {}
        self._pushed_view = MappingProxyType(self._pushed)  # live, read-only
        self._persisted: dict[str, int] = {}
        self._inactive: dict[str, float] = {}  # name -> time it went inactive
        self._snapshot_counter = 0
        self._last_snapshot_time = clock()
        self._last_recorded_position: Position | None = None
        self._snapshot_task: asyncio.Future[None] | None = None
        self._transition: asyncio.Future[None] | None = None
        self._transition_target = False

    def attach(self, extension: DedupExtension) -> None:
        if self._extension is not None:
            raise RuntimeError("an extension is already attached")
        self._extension = extension

    # -- read-only views -------------------------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self._status

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def _set_status(self, status: Status) -> None:
        self._status = status
        self._enabled = status is Status.ENABLED

    @property
    def pushed(self) -> Mapping[str, int]:
        return self._pushed_view

    @property
    def persisted(self) -> Mapping[str, int]:
        return MappingProxyType(self._persisted)

    @property
    def inactive(self) -> Mapping[str, float]:
        return MappingProxyType(self._inactive)

    @property
    def last_recorded_position(self) -> Position | None:
        return self._last_recorded_position

    def pushed_sequence_id(self, name: str) -> int | None:
        return self._pushed.get(name)

    def persisted_sequence_id(self, name: str) -> int | None:
        return self._persisted.get(name)

    def last_sequence_id(self, name: str) -> int:
        """What a (re)connecting producer resumes from (Pulsar's `last_sequence_id`): pushed, or -1."""
        return self._pushed.get(name, -1)

    # -- status ----------------------------------------------------------------------------------------------------

    async def check_status(self, enabled: bool) -> Status:
        """Follow the `enabled` policy: enable = open the cursor and recover; disable = delete it and clear.

        A system topic is never deduplicated. Concurrent calls share the transition in flight; the status turns
        Recovering/Removing before anything is awaited, so two calls never run two recoveries. Failed is retried
        from clean state by the next call that wants dedup enabled.
        """
        enabled = enabled and not self._system_topic
        while self._transition is not None:
            in_flight, target = self._transition, self._transition_target
            await asyncio.shield(in_flight)
            if target == enabled:
                return self._status
        work = self._begin_transition(enabled)
        if work is not None:
            self._transition = asyncio.ensure_future(self._run_transition(work))
            self._transition_target = enabled
            await asyncio.shield(self._transition)
        return self._status

    def _begin_transition(self, enabled: bool) -> Coroutine[Any, Any, None] | None:
        if enabled and self._status in (Status.INITIALIZED, Status.DISABLED, Status.FAILED):
            self._set_status(Status.RECOVERING)
            return self._enable()
        if not enabled and self._status in (Status.INITIALIZED, Status.ENABLED):
            self._set_status(Status.REMOVING)
            return self._disable()
        return None

    async def _run_transition(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        finally:
            self._transition = None

    async def _enable(self) -> None:
        try:
            cursor = await self._ledger.open_cursor(DEDUP_CURSOR_NAME)
            await self._recover(cursor)
        except Exception:
            log.exception("%s: dedup recovery failed; status Failed until the next check", self._log_name)
            self._cursor = None
            self._set_status(Status.FAILED)
            return
        self._cursor = cursor
        self._last_snapshot_time = self._clock()
        self._set_status(Status.ENABLED)
        log.info("%s: dedup enabled, %d producers", self._log_name, len(self._persisted))

    async def _disable(self) -> None:
        try:
            await self._ledger.delete_cursor(DEDUP_CURSOR_NAME)
        except Exception:
            log.exception("%s: deleting the dedup cursor failed; status Failed", self._log_name)
            self._set_status(Status.FAILED)
            return
        self._cursor = None
        self._clear_state()
        self._set_status(Status.DISABLED)
        log.info("%s: dedup disabled", self._log_name)

    def _clear_state(self) -> None:
        self._pushed.clear()
        self._persisted.clear()
        self._inactive.clear()
        self._snapshot_counter = 0
        self._last_recorded_position = None
        if self._extension is not None:
            self._extension.reset()

    # -- recovery --------------------------------------------------------------------------------------------------

    async def _recover(self, cursor: DedupCursor) -> None:
        """Snapshot, then every entry after it; the maps end as they were after the last durable entry."""
        self._clear_state()
        now = self._clock()
        owned: dict[str, int] = {}
        for name, value in cursor.properties.items():
            if self._extension is not None and self._extension.owns_property(name):
                owned[name] = value
            else:
                self._pushed[name] = self._persisted[name] = value
                self._inactive[name] = now  # a producer that never comes back can be purged
        if self._extension is not None:
            self._extension.restore(owned)

        start = cursor.mark_delete_position
        last, replayed = start, 0
        async for entry in self._ledger.replay_after(start):
            replayed += 1
            last = entry.position
            self._replay_entry(entry, now)
        self._last_recorded_position = last
        log.info("%s: dedup replayed %d entries after %s", self._log_name, replayed, start)
        if replayed >= self._config.entries_interval:
            # A long replay is paid once: snapshot now so the next recovery starts here (Pulsar PR #22479).
            await self._mark_delete(cursor, last, self._snapshot_properties())
        else:
            self._snapshot_counter = replayed

    def _replay_entry(self, entry: ReplayEntry, now: float) -> None:
        metadata = entry.metadata
        if not carries_dedup_identity(metadata):
            return
        name = metadata.producer_name
        self._pushed[name] = self._persisted[name] = max(metadata.sequence_id, metadata.highest_sequence_id)
        self._inactive[name] = now
        if self._extension is not None:
            self._extension.replay(entry)

    # -- the produce path ------------------------------------------------------------------------------------------

    def is_duplicate(self, name: str, sequence_id: int, highest_sequence_id: int) -> DupStatus:
        """Pulsar's isDuplicateNormal: a batch is judged by its lowest id; NotDup advances pushed to its highest."""
        if not self._enabled:
            return DupStatus.NOT_DUP
        last_pushed = self._pushed.get(name)
        if last_pushed is not None and sequence_id <= last_pushed:
            last_persisted = self._persisted.get(name)
            if last_persisted is not None and sequence_id <= last_persisted:
                return DupStatus.DUP
            return DupStatus.UNKNOWN
        self._pushed[name] = highest_sequence_id if highest_sequence_id > sequence_id else sequence_id
        return _NOT_DUP

    def record_persisted(self, name: str | None, sequence_id: int, highest_sequence_id: int,
                         position: Position) -> None:
        """An entry is durable at `position` (call in log order). `name=None`: an entry without dedup identity,
        counted all the same so the replay after a snapshot stays short."""
        if not self._enabled:
            return
        if name is not None:
            self._persisted[name] = highest_sequence_id if highest_sequence_id > sequence_id else sequence_id
        self._last_recorded_position = position
        self._snapshot_counter += 1
        if self._snapshot_counter >= self._config.entries_interval:
            self._snapshot_counter = 0
            self._start_snapshot(position)

    def reset_pushed_to_persisted(self) -> None:
        """After a failed write (the partition is fenced and in-flight writes drained): forget what never landed,
        so the client's retry is accepted again."""
        self._pushed.clear()  # in place: `pushed` is a live view that callers may hold
        self._pushed.update(self._persisted)

    def forget(self, name: str) -> None:
        """Drop a name from every map (Kafka drops a producer's previous epoch this way)."""
        self._pushed.pop(name, None)
        self._persisted.pop(name, None)
        self._inactive.pop(name, None)

    # -- snapshots -------------------------------------------------------------------------------------------------

    def snapshot_if_due(self, now: float | None = None, interval_seconds: float | None = None) -> bool:
        """The time check (call it periodically): snapshot the last recorded position if the last snapshot is at
        least the interval old and the position is new. `interval_seconds` is the resolved policy. Returns whether
        a snapshot was started."""
        if not self._enabled or self._cursor is None:
            return False
        interval = self._config.snapshot_interval_seconds if interval_seconds is None else interval_seconds
        if interval <= 0:
            return False
        now = self._clock() if now is None else now
        if now - self._last_snapshot_time < interval:
            return False
        position = self._last_recorded_position
        if position is None or position <= self._cursor.mark_delete_position:
            return False
        return self._start_snapshot(position)

    async def flush_snapshot(self) -> None:
        """Wait for the snapshot in flight, if any (before closing the partition, and in tests)."""
        if self._snapshot_task is not None:
            await asyncio.shield(self._snapshot_task)

    async def close(self) -> None:
        await self.flush_snapshot()

    def _start_snapshot(self, position: Position) -> bool:
        if self._cursor is None:
            return False
        if self._snapshot_task is not None:
            log.warning("%s: dedup snapshot at %s skipped, another one is in flight", self._log_name, position)
            return False
        # The properties are taken now, synchronously, so they match `position` exactly.
        properties = self._snapshot_properties()
        self._snapshot_task = asyncio.ensure_future(self._run_snapshot(self._cursor, position, properties))
        return True

    async def _run_snapshot(self, cursor: DedupCursor, position: Position, properties: dict[str, int]) -> None:
        try:
            await self._mark_delete(cursor, position, properties)
        finally:
            self._snapshot_task = None

    async def _mark_delete(self, cursor: DedupCursor, position: Position, properties: dict[str, int]) -> None:
        try:
            await cursor.mark_delete(position, properties)
        except Exception as exc:  # the next trigger retries; the old snapshot stays valid
            log.warning("%s: dedup snapshot at %s failed: %r", self._log_name, position, exc)
            return
        self._last_snapshot_time = self._clock()

    def _snapshot_properties(self) -> dict[str, int]:
        extension = self._extension
        names = (n for n in self._persisted if extension is None or not extension.owns_property(n))
        kept = list(itertools.islice(names, self._config.max_producers))
        properties = {name: self._persisted[name] for name in kept}
        if extension is not None:
            properties.update(extension.snapshot_properties(frozenset(kept)))
        return properties

    # -- producer lifecycle and purge ------------------------------------------------------------------------------

    def producer_added(self, name: str) -> None:
        if self._enabled:
            self._inactive.pop(name, None)

    def producer_removed(self, name: str, now: float | None = None) -> None:
        if self._enabled:
            self._inactive[name] = self._clock() if now is None else now

    def purge_inactive(self, timeout_seconds: float, now: float | None = None) -> list[str]:
        """Drop producers inactive for longer than the timeout and rewrite the snapshot, at the same position,
        without them. Returns the names purged. (Pulsar runs this every timeout / 3.)"""
        if not self._enabled:
            self._inactive.clear()
            return []
        cutoff = (self._clock() if now is None else now) - timeout_seconds
        purged = [
            name
            for name, since in self._inactive.items()
            if since < cutoff and self._pushed.get(name) == self._persisted.get(name)
        ]
        for name in purged:
            self.forget(name)
        if purged:
            if self._extension is not None:
                self._extension.forget(purged)
            assert self._cursor is not None
            self._start_snapshot(self._cursor.mark_delete_position)
            log.info("%s: dedup purged %d inactive producers", self._log_name, len(purged))
        return purged
