"""PIP-6 message deduplication for one partition (Pulsar's MessageDeduplication), without I/O of its own.

Per producer name, two maps of the highest sequence id: `pushed` (set when a write is accepted, before storage) and
`persisted` (set when the write is durable; the only one snapshotted). The produce path asks `is_duplicate` before
writing and calls `record_persisted` after, synchronously and in log order. Storage is reached only through
`dedup.interfaces`; the snapshot is the properties of the `pulsar.dedup` cursor's mark-delete.

Deliberate differences from Pulsar, each closing a hazard it has:
* a snapshot is only ever taken at a position whose persist has been recorded (`last_recorded_position`), never at
  the ledger's last confirmed entry read on the side, so no snapshot claims an entry its properties lack;
* a purge never drops a name with a write in flight (pushed != persisted);
* the entry counter counts entries since the last snapshot that was stored: one that fails, or is skipped because
  another is in flight, leaves the count due, so the next entry tries again; after a recovery without a snapshot it
  starts at the number of entries replayed. Replay length stays bounded by `entries_interval` across restarts;
* a purge re-snapshot that finds another snapshot in flight runs after it, never not at all;
* while the policy wants dedup but the state is not rebuilt (Recovering, or Failed), `awaiting_recovery` says so:
  the caller must not accept what it cannot judge (Pulsar fails the topic load instead), and `retry_recovery`
  starts a new recovery from clean state once `recovery_retry_seconds` have passed since the failure;
* a status check that finds a transition in flight waits for it, then acts on its own request if it differs;
* a replay never moves a name's sequence backwards (an era with dedup off may have stored a retry twice);
* a snapshot by entry count comes after `entries_interval` entries, or after as many entries as it holds names if
  that is more: a snapshot's cost grows with its names, so this keeps it to a few microseconds per entry however
  many producers a partition has (replay after a crash is bounded the same way). A snapshot of many names is
  packed in a worker thread from a copy taken at its position, so the event loop keeps serving;
* with more names than `max_producers`, a snapshot keeps the names whose last persisted write is the most recent
  (Pulsar keeps whichever its map iteration reaches first): names are kept in that order, and snapshots are written
  in it, so a recovery restores it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

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

ACTIVE = math.inf  # a name's "inactive since" while it is active: never purged
LARGE_SNAPSHOT = 1000  # names from which a snapshot is packed in a worker thread


@dataclass(frozen=True, slots=True)
class DedupConfig:
    """Pulsar's broker settings of the same meaning (`brokerDeduplication*`)."""

    entries_interval: int = 1000  # persisted entries between snapshots (at least; see MessageDeduplication)
    snapshot_interval_seconds: float = 120.0  # default for the time check; <= 0 disables it
    max_producers: int = 100_000  # cap on the names written into one snapshot (Pulsar's is 10,000)
    recovery_retry_seconds: float = 2.0  # after a failed recovery, the earliest retry_recovery starts another


class Snapshot(NamedTuple):
    """What one cursor record holds: the persisted map (name -> highest sequence id, in the order of the names' last
    writes) and the extension's state, packed in string properties."""

    properties: dict[str, int]
    strings: dict[str, str]


class Recovery(NamedTuple):
    """The last recovery of a partition's state: how long it took and how many entries it replayed."""

    seconds: float
    replayed: int


class DedupExtension(Protocol):
    """State kept beside the two maps that must be snapshotted and rebuilt with them (Kafka's producer state).

    Its state shares the cursor record with the maps, in string properties; an older format kept it in properties,
    under the keys for which `owns_property` is true.
    """

    def owns_property(self, key: str) -> bool: ...

    def reset(self, recovering: bool) -> None:
        """Drop all state (dedup disabled, or a recovery starting). A recovery keeps what clients were told to
        resend while the state could not judge their batches: the rebuilt state must still hold their followers
        back."""

    def restore(self, properties: Mapping[str, int], strings: Mapping[str, str]) -> None:
        """Load the owned snapshot properties and the string properties; called after the maps are loaded, before
        the replay."""

    def replay(self, entry: ReplayEntry) -> None:
        """Apply one replayed entry that carries a producer name, after the maps were updated for it."""

    def replay_marker(self, metadata: MessageMetadata) -> None:
        """Apply one replayed transaction marker written here (it may raise its producer's epoch)."""

    def replayed_highest(self, metadata: MessageMetadata, known: int) -> int:
        """The highest sequence id a replayed entry records for its producer name, read near `known`, the value
        the state holds for that name (an entry written while deduplication was off may record Kafka's wrapping
        int32 sequences where the state holds them unwrapped)."""
        ...

    def capture(self) -> Callable[[Collection[str]], dict[str, str]]:
        """Copy the state as it is now, for a snapshot at this moment; the function returned, which may run in
        another thread, packs it for the producer names that made it into the snapshot, as string properties."""
        ...

    def forget(self, names: Collection[str]) -> None:
        """These names were purged for inactivity."""

    def expire(self, before: float) -> None:
        """The inactivity purge runs: drop what is kept for producers not heard of since `before`."""


def _names_to_snapshot(order: list[str], persisted: Mapping[str, int], cap: int) -> list[str]:
    """The persisted names in the order of their last writes; past `cap`, only the most recent."""
    names = [name for name in order if name in persisted]
    if len(names) < len(persisted):  # not in the order: none should be, but none may be lost
        ordered = set(order)
        names[:0] = [name for name in persisted if name not in ordered]
    return names[len(names) - cap:] if len(names) > cap else names


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
        # Read for every batch, so plain attributes rather than properties (a property is a Python call each time).
        self.is_enabled = False  # status is ENABLED; only _set_status changes it
        self._cursor: DedupCursor | None = None
        self._pushed: dict[str, int] = {}
        self._pushed_view = MappingProxyType(self._pushed)  # live, read-only
        self._persisted: dict[str, int] = {}
        # name -> highest sequence id, or None: both dicts are only ever changed in place, so the bound `get`s stay
        # live (a bound dict method is several times cheaper than a method or a MappingProxyType's get).
        self.pushed_sequence_id: Callable[[str], int | None] = self._pushed.get
        self.persisted_sequence_id: Callable[[str], int | None] = self._persisted.get
        # name -> since when it is inactive (ACTIVE while it is not), in the order of the names' last persisted
        # writes, oldest first: the purge's clock and, when a snapshot cannot hold every name, which it keeps.
        self._activity: dict[str, float] = {}
        self._recorded = 0  # entries recorded since the recovery, replayed ones included
        self._snapshot_every = config.entries_interval  # entries between count snapshots, as the last one set it
        self._snapshotted = 0  # how many of those the stored snapshot covers
        self._last_snapshot_time = clock()
        self._last_recorded_position: Position | None = None
        self._snapshot_task: asyncio.Future[None] | None = None
        self._snapshot_again = False  # a snapshot that must not be dropped waits for the one in flight
        self._transition: asyncio.Future[None] | None = None
        self._transition_target = False
        self._wanted = False  # the policy, as the last status check asked for it
        self._failed_at = clock()
        self.snapshots_stored = 0  # snapshots stored since the partition was opened (a metric)
        self.last_recovery: Recovery | None = None

    def attach(self, extension: DedupExtension) -> None:
        if self._extension is not None:
            raise RuntimeError("an extension is already attached")
        self._extension = extension

    # -- read-only views -------------------------------------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self._status

    def _set_status(self, status: Status) -> None:
        self._status = status
        self.is_enabled = status is Status.ENABLED

    @property
    def awaiting_recovery(self) -> bool:
        """The policy wants dedup but the state is not rebuilt yet (recovery in flight or failed): a batch cannot be
        judged, so the caller must ask the client to retry it rather than accept it unchecked."""
        return self._status is Status.RECOVERING or (self._status is Status.FAILED and self._wanted)

    @property
    def pushed(self) -> Mapping[str, int]:
        return self._pushed_view

    @property
    def persisted(self) -> Mapping[str, int]:
        return MappingProxyType(self._persisted)

    @property
    def inactive(self) -> Mapping[str, float]:
        """The names that are inactive, with the time since when."""
        return {name: since for name, since in self._activity.items() if since != ACTIVE}

    @property
    def last_recorded_position(self) -> Position | None:
        return self._last_recorded_position

    def now(self) -> float:
        """The clock the inactivity purge is measured with."""
        return self._clock()

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
        enabled = self._wanted = enabled and not self._system_topic
        while self._transition is not None:
            in_flight, target = self._transition, self._transition_target
            await asyncio.shield(in_flight)
            if target == enabled:
                return self._status
        transition = self._start_transition(enabled)
        if transition is not None:
            await asyncio.shield(transition)
        return self._status

    def retry_recovery(self) -> bool:
        """Start a recovery in the background if the policy wants dedup, the last recovery failed, and the retry
        delay has passed since (the produce path calls this while `awaiting_recovery`). Returns whether it did."""
        if self._status is not Status.FAILED or not self._wanted or self._transition is not None:
            return False
        if self._clock() - self._failed_at < self._config.recovery_retry_seconds:
            return False
        log.info("%s: retrying the dedup recovery", self._log_name)
        return self._start_transition(True) is not None

    def _start_transition(self, enabled: bool) -> asyncio.Future[None] | None:
        work = self._begin_transition(enabled)
        if work is None:
            return None
        self._transition = asyncio.ensure_future(self._run_transition(work))
        self._transition_target = enabled
        return self._transition

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
            log.exception("%s: dedup recovery failed; status Failed until a retry", self._log_name)
            self._cursor = None
            self._failed_at = self._clock()
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
        self._clear_state(recovering=False)
        self._set_status(Status.DISABLED)
        log.info("%s: dedup disabled", self._log_name)

    def _clear_state(self, recovering: bool) -> None:
        self._pushed.clear()
        self._persisted.clear()
        self._activity.clear()
        self._recorded = self._snapshotted = 0
        self._snapshot_again = False
        self._last_recorded_position = None
        if self._extension is not None:
            self._extension.reset(recovering)

    # -- recovery --------------------------------------------------------------------------------------------------

    async def _recover(self, cursor: DedupCursor) -> None:
        """Snapshot, then every entry after it; the maps end as they were after the last durable entry."""
        self._clear_state(recovering=True)
        started = time.monotonic()
        now = self._clock()
        owned: dict[str, int] = {}
        for name, value in cursor.properties.items():  # stored in the order of their last writes: keep it
            if self._extension is not None and self._extension.owns_property(name):
                owned[name] = value
            else:
                self._pushed[name] = self._persisted[name] = value
                self._activity[name] = now  # a producer that never comes back can be purged
        if self._extension is not None:
            self._extension.restore(owned, cursor.string_properties)

        start = cursor.mark_delete_position
        last, replayed = start, 0
        async for entry in self._ledger.replay_after(start):
            replayed += 1
            last = entry.position
            self._replay_entry(entry, now)
        self._last_recorded_position = last
        self._recorded = replayed
        self.last_recovery = Recovery(time.monotonic() - started, replayed)
        log.info("%s: dedup replayed %d entries after %s in %.3fs", self._log_name, replayed, start,
                 self.last_recovery.seconds)
        if replayed >= max(self._config.entries_interval, len(self._persisted)):
            # A long replay is paid once: snapshot now so the next recovery starts here (Pulsar PR #22479).
            if await self._mark_delete(cursor, last, self._take_snapshot()):
                self._snapshotted = replayed

    def _replay_entry(self, entry: ReplayEntry, now: float) -> None:
        metadata = entry.metadata
        # A marker written here stays out of the state; one a replicator sent holds its source position.
        if metadata.is_control or (metadata.HasField("marker_type") and not metadata.replicated_from):
            if metadata.is_control and not metadata.replicated_from and self._extension is not None:
                self._extension.replay_marker(metadata)
            return
        for named in metadata.named_sequences:
            self._replay_name(named.name, named.sequence_id, now)
        if not metadata.producer_name:
            return
        highest = max(metadata.sequence_id, metadata.highest_sequence_id)
        known = self._persisted.get(metadata.producer_name)
        if known is not None and self._extension is not None:
            highest = self._extension.replayed_highest(metadata, known)
        self._replay_name(metadata.producer_name, highest, now)
        if self._extension is not None:
            self._extension.replay(entry)

    def _replay_name(self, name: str, highest: int, now: float) -> None:
        # Never backwards: where dedup was off, a retry may have been stored again after later batches.
        value = max(highest, self._persisted.get(name, -1))
        self._pushed[name] = self._persisted[name] = value
        self._activity.pop(name, None)  # the most recently written name from now on
        self._activity[name] = now

    # -- the produce path ------------------------------------------------------------------------------------------

    def is_duplicate(self, name: str, sequence_id: int, highest_sequence_id: int) -> DupStatus:
        """Pulsar's isDuplicateNormal: a batch is judged by its lowest id; NotDup advances pushed to its highest."""
        if not self.is_enabled:
            return DupStatus.NOT_DUP
        last_pushed = self._pushed.get(name)
        if last_pushed is not None and sequence_id <= last_pushed:
            last_persisted = self._persisted.get(name)
            if last_persisted is not None and sequence_id <= last_persisted:
                return DupStatus.DUP
            return DupStatus.UNKNOWN
        self._pushed[name] = highest_sequence_id if highest_sequence_id > sequence_id else sequence_id
        return _NOT_DUP

    def judge(self, name: str, sequence_id: int) -> DupStatus:
        """`is_duplicate` without its effect: a caller that judges several names at once pushes them (`push`) only
        once it knows it will write them all."""
        if not self.is_enabled:
            return DupStatus.NOT_DUP
        last_pushed = self._pushed.get(name)
        if last_pushed is None or sequence_id > last_pushed:
            return _NOT_DUP
        last_persisted = self._persisted.get(name)
        return DupStatus.DUP if last_persisted is not None and sequence_id <= last_persisted else DupStatus.UNKNOWN

    def push(self, name: str, highest_sequence_id: int) -> None:
        """A write of the name up to `highest_sequence_id` is accepted (after `judge` said NotDup)."""
        if self.is_enabled:
            self._pushed[name] = highest_sequence_id

    def record_persisted_names(self, sequences: Iterable[tuple[str, int]]) -> None:
        """Names an entry stores beside its producer's own (application-chosen sequence ids, each at the highest id
        the entry holds). Call before `record_persisted` of the same entry, which counts it, so a snapshot it
        triggers holds them. Their producers have no write in flight once it is durable: inactive from now on."""
        if not self.is_enabled:
            return
        persisted, activity, now = self._persisted, self._activity, self._clock()
        for name, sequence_id in sequences:
            persisted[name] = sequence_id
            activity.pop(name, None)
            activity[name] = now

    def record_persisted(self, name: str | None, sequence_id: int, highest_sequence_id: int, position: Position,
                         idle: bool | None = None) -> None:
        """An entry is durable at `position` (call in log order). `name=None`: an entry without dedup identity,
        counted all the same so the replay after a snapshot stays short.

        `idle` folds `producer_added`/`producer_removed` into this call, which runs for every batch: Kafka and
        application producers have no connection to the partition that would say when they leave, so a name is
        inactive from its last write on (True), or active while its producer has other writes in flight (False).
        None leaves its activity as `producer_added`/`producer_removed` set it, as Pulsar does for connected
        producers."""
        if not self.is_enabled:
            return
        if name is not None:
            self._persisted[name] = highest_sequence_id if highest_sequence_id > sequence_id else sequence_id
            activity = self._activity
            since = activity.pop(name, ACTIVE)  # re-added at the end: the names stay in order of last write
            activity[name] = since if idle is None else self._clock() if idle else ACTIVE
        self._last_recorded_position = position
        self._recorded += 1
        if self._recorded - self._snapshotted >= self._snapshot_every and self._snapshot_task is None:
            self._start_snapshot()

    def record_untracked(self, name: str, sequence_id: int, highest_sequence_id: int, position: Position,
                         idle: bool | None = None) -> None:
        """An entry accepted before dedup was enabled became durable after: take its ids as a replay would (Pulsar
        records them from the publish context), so no snapshot covers its position without them."""
        if not self.is_enabled:
            return
        value = max(sequence_id, highest_sequence_id, self._persisted.get(name, -1))
        self._pushed[name] = max(value, self._pushed.get(name, value))
        self.record_persisted(name, value, value, position, idle)

    def reset_pushed_to_persisted(self) -> None:
        """After a failed write (the partition is fenced and in-flight writes drained): forget what never landed,
        so the client's retry is accepted again."""
        self._pushed.clear()  # in place: `pushed` is a live view that callers may hold
        self._pushed.update(self._persisted)

    def record_epoch_started(self, name: str) -> None:
        """A producer name durable with no sequence yet (a Kafka producer's epoch begun by a transaction marker): at
        -1 unless it has one, so snapshots keep it and its first batch must be sequence 0; inactive from now on.
        Also called by a replay (the state is not enabled yet then)."""
        if name in self._persisted:
            return
        self._persisted[name] = -1
        self._pushed.setdefault(name, -1)
        self._activity.pop(name, None)
        self._activity[name] = self._clock()

    def forget(self, name: str) -> None:
        """Drop a name from every map (Kafka drops a producer's previous epoch this way)."""
        self._pushed.pop(name, None)
        self._persisted.pop(name, None)
        self._activity.pop(name, None)

    # -- snapshots -------------------------------------------------------------------------------------------------

    def snapshot_if_due(self, now: float | None = None, interval_seconds: float | None = None) -> bool:
        """The time check (call it periodically): snapshot the last recorded position if the last snapshot is at
        least the interval old and the position is new. `interval_seconds` is the resolved policy. Returns whether
        a snapshot was started."""
        if not self.is_enabled or self._cursor is None or self._snapshot_task is not None:
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
        return self._start_snapshot()

    def snapshot_now(self) -> bool:
        """Snapshot the last recorded position now, even where the cursor already is: every record the cursor keeps
        (the newest and its fallback) then stands there, so what lies behind them can go. Retention asks for it
        when those records hold back a ledger it would delete. Returns whether a snapshot was started."""
        return self.is_enabled and self._start_snapshot()

    async def flush_snapshot(self) -> None:
        """Wait for the snapshots in flight or queued, if any (before closing the partition, and in tests)."""
        while self._snapshot_task is not None:
            await asyncio.shield(self._snapshot_task)

    async def close(self) -> None:
        await self.flush_snapshot()

    def _start_snapshot(self) -> bool:
        """Snapshot at the last recorded position; its properties are taken now, so they match it exactly."""
        position = self._last_recorded_position
        if self._cursor is None or position is None or self._snapshot_task is not None:
            return False
        self._snapshot_task = asyncio.ensure_future(
            self._run_snapshot(self._cursor, position, self._take_snapshot(), self._recorded))
        return True

    async def _run_snapshot(self, cursor: DedupCursor, position: Position, snapshot: Callable[[], Snapshot],
                            recorded: int) -> None:
        try:
            stored = await self._mark_delete(cursor, position, snapshot) and cursor is self._cursor
            if stored:
                self._snapshotted = max(self._snapshotted, recorded)
        finally:
            self._snapshot_task = None
        # A purge's snapshot, or one the entry count asked for meanwhile, goes next (not after a failure: the next
        # entry retries that one; nor once cancelled: the partition is closing).
        due = stored and self._recorded - self._snapshotted >= self._snapshot_every
        if (self._snapshot_again or due) and self.is_enabled:
            self._snapshot_again = False
            self._start_snapshot()

    async def _mark_delete(self, cursor: DedupCursor, position: Position, take: Callable[[], Snapshot]) -> bool:
        try:
            if len(self._persisted) < LARGE_SNAPSHOT:
                snapshot = take()
            else:  # packing many names would stall every connection: a thread leaves the event loop its turns
                snapshot = await asyncio.get_running_loop().run_in_executor(None, take)
            await cursor.mark_delete(position, snapshot.properties, snapshot.strings)
        except Exception as exc:  # the next trigger retries; the old snapshot stays valid
            log.warning("%s: dedup snapshot at %s failed: %r", self._log_name, position, exc)
            return False
        self._last_snapshot_time = self._clock()
        self.snapshots_stored += 1
        return True

    def _take_snapshot(self) -> Callable[[], Snapshot]:
        """The state as it is now (copies: C-speed, even for many names), and the function that makes the snapshot
        of it (which may run in another thread). Also sets when the next snapshot by entry count is due."""
        persisted, order, cap = dict(self._persisted), list(self._activity), self._config.max_producers
        pack = self._extension.capture() if self._extension is not None else None
        self._snapshot_every = max(self._config.entries_interval, len(persisted))

        def snapshot() -> Snapshot:
            kept = _names_to_snapshot(order, persisted, cap)
            properties = {name: persisted[name] for name in kept}
            return Snapshot(properties, pack(frozenset(kept)) if pack is not None else {})

        return snapshot

    # -- producer lifecycle and purge ------------------------------------------------------------------------------

    def producer_added(self, name: str) -> None:
        """Active: not purged. Where the name stands in the order of last writes does not change."""
        if self.is_enabled and name in self._activity:
            self._activity[name] = ACTIVE

    def producer_removed(self, name: str, now: float | None = None) -> None:
        if self.is_enabled:
            self._activity[name] = self._clock() if now is None else now

    def purge_inactive(self, timeout_seconds: float, now: float | None = None) -> list[str]:
        """Drop producers inactive for longer than the timeout and rewrite the snapshot without them, at the last
        recorded position (after the snapshot in flight, if any: skipping it would bring the names back after a
        crash). Returns the names purged. (Pulsar runs this every timeout / 3.)"""
        if not self.is_enabled:
            self._activity.clear()
            return []
        cutoff = (self._clock() if now is None else now) - timeout_seconds
        if self._extension is not None:
            self._extension.expire(cutoff)
        purged = [
            name
            for name, since in self._activity.items()
            if since < cutoff and self._pushed.get(name) == self._persisted.get(name)
        ]
        for name in purged:
            self.forget(name)
        if purged:
            if self._extension is not None:
                self._extension.forget(purged)
            if not self._start_snapshot():
                self._snapshot_again = True
            log.info("%s: dedup purged %d inactive producers", self._log_name, len(purged))
        return purged
