"""What the dedup core needs from storage: a cursor to snapshot into and the entries to replay.

The managed ledger implements these Protocols; nothing in `dedup/` knows how. The rules every implementation must
keep (they are what makes a snapshot plus a replay rebuild the state exactly):

* A position is `(ledger_id, entry_id)`; positions compare as tuples, in log order. `BEFORE_FIRST` (-1, -1) comes
  before every entry.
* A cursor's mark-delete position and its properties are one record: after a crash a reader gets either the old
  pair or the new pair, never a mix (Pulsar writes both in one `PositionInfo`).
* `replay_after(p)` yields every durable entry after `p`, in log order, including entries appended after the call
  started if the implementation can (the caller does not write while it replays).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from proto.kop_pb2 import MessageMetadata

Position = tuple[int, int]
BEFORE_FIRST: Position = (-1, -1)

# Pulsar's name for the cursor whose mark-delete properties hold the dedup snapshot.
DEDUP_CURSOR_NAME = "pulsar.dedup"


@dataclass(frozen=True, slots=True)
class ReplayEntry:
    """One stored entry as recovery sees it: its position, its header, and the Kafka offsets it holds."""

    position: Position
    metadata: MessageMetadata
    first_offset: int
    last_offset: int


class DedupCursor(Protocol):
    """The `pulsar.dedup` cursor of one partition."""

    @property
    def mark_delete_position(self) -> Position:
        """Position of the last snapshot (`BEFORE_FIRST`-like values allowed for a cursor on an empty log)."""
        ...

    @property
    def properties(self) -> dict[str, int]:
        """The properties stored with `mark_delete_position` (str -> int64)."""
        ...

    @property
    def string_properties(self) -> dict[str, str]:
        """String properties stored with `mark_delete_position` (state kept beside the maps, packed)."""
        ...

    async def mark_delete(self, position: Position, properties: dict[str, int],
                          string_properties: dict[str, str] | None = None) -> None:
        """Store `(position, properties, string_properties)` atomically and durably, replacing the previous record
        (string properties unchanged when None).

        The same position again replaces only the properties (a purge re-snapshot does this). Raises if `position`
        is before the current mark-delete or after the last durable entry; the caller then keeps the old snapshot.
        """
        ...


class EntrySource(Protocol):
    def replay_after(self, position: Position) -> AsyncIterator[ReplayEntry]:
        """Durable entries strictly after `position`, in log order."""
        ...


class DedupLedger(EntrySource, Protocol):
    """The managed ledger of one partition, as far as deduplication is concerned."""

    async def open_cursor(self, name: str) -> DedupCursor:
        """The named cursor; a new one starts at the end of the log with no properties (Pulsar's default), and is
        durable when returned: a crash must not bring it back "at the end" of a longer log, skipping a replay. A
        cursor the storage may have lost (its records damaged) comes back before the first entry, with no
        properties, so the replay covers everything still stored."""
        ...

    async def delete_cursor(self, name: str) -> None:
        """Delete the named cursor; deleting a cursor that does not exist is not an error."""
        ...
