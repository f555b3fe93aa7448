"""The PostgreSQL side of the engine: a connection pool and every statement the engine runs.

Fencing: opening a managed ledger raises its epoch; every write names the epoch it was opened with and changes
nothing unless that is still the current one (checked in the same statement, under the row's lock), so a broker that
lost a partition can never write to it again. In a cluster (kop/cluster) the store also knows its broker's session,
and every write and every opening checks, in the same transaction and by the database's clock, that the session's
lease has not expired: a broker paused past its lease cannot write even before another broker takes its partitions
over. A write refused this way raises LedgerFencedOut.
"""
import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from kop.ledger.errors import LedgerFencedOut, ManagedLedgerError
from kop.ledger.framed_file import HEADER_SIZE
from kop.ledger.ledger_file import ENTRY_HEADER
from kop.ledger.position import Position
from kop.ledger.postgres.entry_cache import EntryCache
from kop.ledger.postgres.schema import migrate
from kop.ledger.time_index import TIMESTAMP_END

POOL_SIZE = 8
DATABASE_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError)  # a statement the database refused or never got
FRAMED_ENTRY_HEADER = HEADER_SIZE + ENTRY_HEADER.size  # 8 + 14: the metadata length is its last two bytes


class DatabaseUnreachable(ManagedLedgerError):
    """A statement failed on the database's side (down, restarting, the connection lost): nothing was changed."""


FENCED = "another broker owns it now, or this broker's lease expired"


def _leased(session: str) -> str:
    """SQL: the broker session named by the parameter `session` holds an unexpired lease (always true without one)."""
    return (f"({session}::bigint IS NULL OR EXISTS (SELECT 1 FROM kop_broker WHERE session = {session} "
            "AND lease_until > clock_timestamp()))")


@dataclass(frozen=True, slots=True)
class LedgerRow:
    epoch: int
    last_ledger_id: int
    end_floor: int
    deleted_before: int
    cleaned_through: int  # the last ledger the log cleaner compacted


@dataclass(frozen=True, slots=True)
class StoredEntry:
    ledger_id: int
    entry_id: int
    payload: bytes  # the framed entry


@dataclass(frozen=True, slots=True)
class StoredHead:
    """An entry without its batch: what the engine indexes (framed header, MessageMetadata, the batch header's
    first bytes, which hold its max timestamp) and the size of the whole framed entry."""

    ledger_id: int
    entry_id: int
    head: bytes
    length: int


@dataclass(frozen=True, slots=True)
class Loaded:
    row: LedgerRow
    closed_ms: dict[int, int]  # ledger id -> closed time (closed ledgers only)
    entries: list[StoredEntry]  # in position order: every entry (whole), or the tail's only (with heads)
    cursors: list[bytes]  # ManagedCursorInfo
    txn_indexed: list[int]  # the ledgers holding a transaction index
    heads: list[StoredHead] | None = None  # in position order, every entry's head: when loaded without the bytes


_APPEND = """
WITH owner AS (
    UPDATE kop_managed_ledger SET last_ledger_id = greatest(last_ledger_id, $3), end_floor = greatest(end_floor, $4)
    WHERE name = $1 AND epoch = $2 AND {leased} RETURNING name),
closed AS (
    UPDATE kop_ledger SET closed_ms = $5
    WHERE name IN (SELECT name FROM owner) AND ledger_id < $3 AND closed_ms IS NULL),
opened AS (
    INSERT INTO kop_ledger (name, ledger_id) SELECT DISTINCT owner.name, l FROM owner, unnest($7::bigint[]) AS l
    ON CONFLICT DO NOTHING),
added AS (
    INSERT INTO kop_entry (name, first_index, ledger_id, entry_id, entry)
    SELECT owner.name, u.f, u.l, u.e, u.b FROM owner, unnest($6::bigint[], $7::bigint[], $8::int[], $9::bytea[])
        AS u(f, l, e, b)
    RETURNING 1)
SELECT count(*) FROM owner
""".format(leased=_leased("$10"))

# Each entry's head without its batch: the frame's header and the entry's (first index, span, metadata length: 22
# bytes), the MessageMetadata, then the batch header up to its max timestamp. The column is stored EXTERNAL
# (uncompressed), so PostgreSQL reads only the slices substring asks for, and octet_length comes from the TOAST
# pointer: a large batch is never read whole.
_HEADS = f"""
SELECT ledger_id, entry_id,
       substring(entry FROM 1 FOR {FRAMED_ENTRY_HEADER} + (get_byte(substring(entry FROM 21 FOR 2), 0) << 8)
                 + get_byte(substring(entry FROM 21 FOR 2), 1) + {TIMESTAMP_END}),
       octet_length(entry)
FROM kop_entry WHERE name = $1 ORDER BY ledger_id, entry_id
"""

_RAISE_VERSION = ("INSERT INTO kop_record_version AS r VALUES ($1, 1) ON CONFLICT (kind) "
                  "DO UPDATE SET version = r.version + 1")

_OWNER_SHARED = f"SELECT 1 FROM kop_managed_ledger WHERE name = $1 AND epoch = $2 AND {_leased('$3')} FOR SHARE"


def _tail_start(heads: list[StoredHead], tail_bytes: int) -> int:
    """The id of the first of the last ledger's last entries whose stored bytes fit in tail_bytes (the last entry
    whatever its size)."""
    last = heads[-1]
    start, total = last.entry_id, last.length
    for head in reversed(heads[:-1]):
        if head.ledger_id != last.ledger_id or total + head.length > tail_bytes:
            break
        start, total = head.entry_id, total + head.length
    return start


class _Connection(asyncpg.Connection):
    """A pooled connection given back without asyncpg's reset statement (advisory unlock, CLOSE ALL, UNLISTEN, RESET
    ALL): one more round trip on every release, for session state kop never leaves. kop takes only transaction-scoped
    advisory locks, declares no cursors, listens to nothing and sets no session settings; a transaction left open is
    still rolled back on release (asyncpg does that whatever the reset statement)."""

    def get_reset_query(self) -> str:
        return ""


class PgStore:
    def __init__(self, url: str, entry_cache_bytes: int | None = None) -> None:
        self.url = url
        # The entry bytes every managed ledger of this broker holds, bounded: None holds them all (each ledger is
        # loaded whole when opened); a bound loads only the index and the tail, the rest on demand (ledger.py).
        self.entry_cache = EntryCache(entry_cache_bytes)
        self._pool: asyncpg.Pool | None = None
        self.session: int | None = None  # this broker's lease (kop/cluster), checked by every write; None: no lease

    async def open(self) -> "PgStore":
        self._pool = await asyncpg.create_pool(self.url, min_size=1, max_size=POOL_SIZE,
                                                 connection_class=_Connection)
        async with self._pool.acquire() as conn:
            await migrate(conn)
        return self

    async def close(self) -> None:
        if self._pool is not None:
            await asyncio.wait_for(self._pool.close(), 10)
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "PgStore.open() first"
        return self._pool

    # ---- managed ledgers

    async def take_ownership(self, name: str, initial_index: int, tail_bytes: int | None = None) -> Loaded:
        """Raise the epoch (fencing out any earlier owner, whose writes wait for this to commit and then fail) and
        read everything stored, in one transaction. Refused (LedgerFencedOut) once this broker's lease expired.
        With tail_bytes: every entry's head (StoredHead), and whole only the last entries of the last ledger that
        fit in tail_bytes (at least one: the tail, which tailing reads want next); the rest is read later with
        `entries`."""
        async with self.pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(f"SELECT {_leased('$1')}", self.session):
                raise LedgerFencedOut(f"{name}: this broker's lease expired")
            row = await conn.fetchrow(
                "INSERT INTO kop_managed_ledger AS m (name, epoch, last_ledger_id, end_floor, deleted_before, "
                "owner_session) VALUES ($1, 1, -1, $2, 0, $3) ON CONFLICT (name) DO UPDATE SET epoch = m.epoch + 1, "
                "owner_session = $3 RETURNING epoch, last_ledger_id, end_floor, deleted_before, cleaned_through",
                name, initial_index, self.session)
            closed = await conn.fetch("SELECT ledger_id, closed_ms FROM kop_ledger WHERE name = $1 "
                                      "AND closed_ms IS NOT NULL", name)
            heads = None
            if tail_bytes is None:
                entries = await conn.fetch("SELECT ledger_id, entry_id, entry FROM kop_entry WHERE name = $1 "
                                           "ORDER BY ledger_id, entry_id", name)
            else:
                heads = [StoredHead(*r) for r in await conn.fetch(_HEADS, name)]
                entries = [] if not heads else await conn.fetch(
                    "SELECT ledger_id, entry_id, entry FROM kop_entry WHERE name = $1 AND ledger_id = $2 "
                    "AND entry_id >= $3 ORDER BY entry_id", name, heads[-1].ledger_id, _tail_start(heads, tail_bytes))
            cursors = await conn.fetch("SELECT info FROM kop_cursor WHERE name = $1", name)
            indexed = await conn.fetch("SELECT ledger_id FROM kop_ledger WHERE name = $1 AND txn_index IS NOT NULL",
                                       name)
        return Loaded(LedgerRow(*row), {r[0]: r[1] for r in closed},
                      [StoredEntry(*r) for r in entries], [r[0] for r in cursors], [r[0] for r in indexed], heads)

    async def entries(self, name: str, ledger_id: int, first_entry: int, last_entry: int) -> list[StoredEntry]:
        """The stored entries first_entry..last_entry of one ledger, in order (a read the cache missed); fewer when
        some are gone (retention deleted the ledger meanwhile)."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT ledger_id, entry_id, entry FROM kop_entry WHERE name = $1 "
                                    "AND ledger_id = $2 AND entry_id BETWEEN $3 AND $4 ORDER BY entry_id",
                                    name, ledger_id, first_entry, last_entry)
        return [StoredEntry(*r) for r in rows]

    async def epochs(self, names: list[str]) -> dict[str, int]:
        """The fencing epoch each named managed ledger has now (those stored): one that differs from the epoch a
        broker opened it with was taken over by another broker since."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT name, epoch FROM kop_managed_ledger WHERE name = ANY($1::text[])", names)
        return {row["name"]: row["epoch"] for row in rows}

    async def append(self, name: str, epoch: int, closed_ms: int, end_index: int,
                     entries: list[tuple[int, int, int, bytes]]) -> None:
        """Store entries (first_index, ledger_id, entry_id, framed bytes) in one statement; ledgers before the last
        one named are closed at closed_ms."""
        first_indexes, ledger_ids, entry_ids, payloads = zip(*entries)
        async with self.pool.acquire() as conn:
            owned = await conn.fetchval(_APPEND, name, epoch, max(ledger_ids), end_index, closed_ms,
                                        first_indexes, ledger_ids, entry_ids, payloads, self.session)
        if not owned:
            raise LedgerFencedOut(f"{name}: {FENCED}")

    async def drop_tail(self, name: str, epoch: int, last_confirmed: Position, end_index: int,
                        next_ledger_id: int) -> None:
        """After a failed append whose outcome is unknown: make sure nothing after the last confirmed entry is
        stored, so the entries reported failed are really not there (by position: a confirmed marker covers no
        offset and starts at end_index too). Ledger ids up to next_ledger_id are never used again."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._check_owner(conn, name, epoch)
            await conn.execute("DELETE FROM kop_entry WHERE name = $1 AND (ledger_id, entry_id) > ($2, $3)",
                               name, last_confirmed.ledger_id, last_confirmed.entry_id)
            await conn.execute("UPDATE kop_managed_ledger SET end_floor = $2, "
                               "last_ledger_id = greatest(last_ledger_id, $3) WHERE name = $1",
                               name, end_index, next_ledger_id)

    async def write_cursors(self, name: str, epoch: int, rows: list[tuple[str, bytes | None]]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._check_owner(conn, name, epoch)
            upserts = [(cursor, info) for cursor, info in rows if info is not None]
            if upserts:
                await conn.executemany("INSERT INTO kop_cursor VALUES ($1, $2, $3) ON CONFLICT (name, cursor) "
                                       "DO UPDATE SET info = excluded.info", [(name, c, i) for c, i in upserts])
            deletes = [cursor for cursor, info in rows if info is None]
            if deletes:
                await conn.execute("DELETE FROM kop_cursor WHERE name = $1 AND cursor = ANY($2::text[])",
                                   name, deletes)

    async def set_deleted_before(self, name: str, epoch: int, index: int) -> None:
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await self._check_owner(conn, name, epoch)
                await conn.execute("UPDATE kop_managed_ledger SET deleted_before = $2 WHERE name = $1", name, index)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:  # DeleteRecords: a storage error
            raise DatabaseUnreachable(f"{name}: the new log start not stored: {exc}") from exc

    async def close_ledger(self, name: str, epoch: int, ledger_id: int, closed_ms: int) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._check_owner(conn, name, epoch)
            await conn.execute("UPDATE kop_ledger SET closed_ms = $3 WHERE name = $1 AND ledger_id = $2",
                               name, ledger_id, closed_ms)

    async def write_txn_index(self, name: str, epoch: int, ledger_id: int, data: bytes) -> bool:
        """Store a closed ledger's transaction index; False when the ledger is gone (deleted by retention)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._check_owner(conn, name, epoch)
            updated = await conn.execute("UPDATE kop_ledger SET txn_index = $3 WHERE name = $1 AND ledger_id = $2",
                                         name, ledger_id, data)
        return updated != "UPDATE 0"

    async def read_txn_index(self, name: str, ledger_id: int) -> bytes | None:
        async with self.pool.acquire() as conn:
            return await conn.fetchval("SELECT txn_index FROM kop_ledger WHERE name = $1 AND ledger_id = $2",
                                       name, ledger_id)

    async def delete_ledger(self, name: str, epoch: int, ledger_id: int) -> None:
        """Retention: one whole ledger and its entries."""
        async with self.pool.acquire() as conn, conn.transaction():
            await self._check_owner(conn, name, epoch)
            await conn.execute("DELETE FROM kop_entry WHERE name = $1 AND ledger_id = $2", name, ledger_id)
            await conn.execute("DELETE FROM kop_ledger WHERE name = $1 AND ledger_id = $2", name, ledger_id)

    async def install_compaction(self, name: str, epoch: int, entries: list[tuple[int, int, bytes]],
                                 cleaned_through: int, before_commit: Callable[[], None] | None = None) -> set[int]:
        """The log cleaner's pass, in one fenced transaction: store each rewritten entry (ledger id, entry id, framed
        bytes) in place of the entry at its position, and record the last ledger cleaned. The ids of the ledgers
        whose entries were replaced (not one retention deleted first). The owner's row is locked first (as an append
        locks it), so retention's deletes and the appends wait for this transaction, never interleave with it."""
        async with self.pool.acquire() as conn, conn.transaction():
            owned = await conn.fetchval(
                "UPDATE kop_managed_ledger SET cleaned_through = greatest(cleaned_through, $3) "
                f"WHERE name = $1 AND epoch = $2 AND {_leased('$4')} RETURNING 1",
                name, epoch, cleaned_through, self.session)
            if not owned:
                raise LedgerFencedOut(f"{name}: {FENCED}")
            stored: set[int] = set()
            if entries:
                ledger_ids, entry_ids, payloads = zip(*entries)
                rows = await conn.fetch(
                    "UPDATE kop_entry e SET entry = u.b FROM unnest($2::bigint[], $3::int[], $4::bytea[]) "
                    "AS u(l, i, b) WHERE e.name = $1 AND e.ledger_id = u.l AND e.entry_id = u.i RETURNING e.ledger_id",
                    name, ledger_ids, entry_ids, payloads)
                stored = {row[0] for row in rows}
            if before_commit is not None:  # a failpoint
                before_commit()
        return stored

    async def remove(self, name: str) -> None:
        """Everything of a managed ledger (its topic was deleted, or a new topic of the same name starts empty)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM kop_entry WHERE name = $1", name)
            await conn.execute("DELETE FROM kop_managed_ledger WHERE name = $1", name)

    async def names_like(self, pattern: str) -> list[str]:
        async with self.pool.acquire() as conn:
            return [r[0] for r in await conn.fetch("SELECT name FROM kop_managed_ledger WHERE name LIKE $1",
                                                   pattern)]

    async def _check_owner(self, conn: asyncpg.Connection, name: str, epoch: int) -> None:
        if await conn.fetchval(_OWNER_SHARED, name, epoch, self.session) is None:
            raise LedgerFencedOut(f"{name}: {FENCED}")

    # ---- consumer-group cursors written by a group's coordinator (kop/cluster/offsets.py), wherever the partition is

    async def group_cursors(self, system_prefix: str) -> list[tuple[str, bytes]]:
        """(managed ledger name, ManagedCursorInfo) of every cursor not named with the system prefix."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT name, info FROM kop_cursor WHERE NOT starts_with(cursor, $1)",
                                    system_prefix)
        return [(row[0], row[1]) for row in rows]

    async def positions_before(self, wanted: list[tuple[str, int]]) -> list[tuple[int, int] | None]:
        """For each (managed ledger name, offset): the position of the last entry starting before the offset (the
        entry a consumer that committed it read last; of a marker and the entry after it, which share their first offset,
        the entry), None when there is none. An index lookup each (schema 7), not a scan of the partition."""
        names, offsets = zip(*wanted)
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT e.ledger_id, e.entry_id FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(n, o, i) "
                "LEFT JOIN LATERAL (SELECT ledger_id, entry_id FROM kop_entry WHERE name = u.n AND first_index < u.o "
                "ORDER BY first_index DESC, ledger_id DESC, entry_id DESC LIMIT 1) e ON true ORDER BY u.i", names, offsets)
        return [None if row[0] is None else (row[0], row[1]) for row in rows]

    async def put_group_cursors(self, fences: dict[str, int], upserts: list[tuple[str, str, bytes]],
                                deletes: list[tuple[str, str]]) -> set[tuple[str, str]]:
        """Write (ledger name, cursor, info) rows and delete (ledger name, cursor) ones, in one transaction that
        first checks each fence (coordinator ledger name -> epoch) as a write of that ledger would; the
        (ledger, cursor) pairs upserted (not those of a ledger that no longer exists)."""
        async with self.pool.acquire() as conn, conn.transaction():
            for name, epoch in fences.items():
                await self._check_owner(conn, name, epoch)
            stored: set[tuple[str, str]] = set()
            if upserts:
                names, cursors, infos = zip(*upserts)
                rows = await conn.fetch(
                    "INSERT INTO kop_cursor (name, cursor, info) SELECT u.n, u.c, u.i FROM unnest($1::text[], "
                    "$2::text[], $3::bytea[]) AS u(n, c, i) WHERE EXISTS (SELECT 1 FROM kop_managed_ledger m "
                    "WHERE m.name = u.n) ON CONFLICT (name, cursor) DO UPDATE SET info = excluded.info "
                    "RETURNING name, cursor", names, cursors, infos)
                stored = {(row[0], row[1]) for row in rows}
            if deletes:
                names, cursors = zip(*deletes)
                await conn.execute("DELETE FROM kop_cursor k USING unnest($1::text[], $2::text[]) AS u(n, c) "
                                   "WHERE k.name = u.n AND k.cursor = u.c", names, cursors)
        return stored

    async def reserve_producer_ids(self, size: int) -> int:
        """The first id of a block of `size` producer ids no other reservation got, durably."""
        async with self.pool.acquire() as conn:
            end = await conn.fetchval(
                "INSERT INTO kop_counter AS c VALUES ('producer_id', $1) ON CONFLICT (name) "
                "DO UPDATE SET value = c.value + $1 RETURNING value", size)
        return end - size

    # ---- small records (topic metadata, ...)

    async def records(self, kind: str) -> dict[str, bytes]:
        async with self.pool.acquire() as conn:
            return {r[0]: r[1] for r in await conn.fetch("SELECT key, value FROM kop_record WHERE kind = $1", kind)}

    async def put_record(self, kind: str, key: str, value: bytes, fence: tuple[str, int] | None = None) -> None:
        """fence: (managed ledger name, epoch) checked in the same transaction, as a write of that ledger would be
        (LedgerFencedOut): a coordinator's records are written only while it holds its shard."""
        async with self.pool.acquire() as conn, conn.transaction():
            if fence is not None:
                await self._check_owner(conn, *fence)
            await conn.execute("INSERT INTO kop_record VALUES ($1, $2, $3) ON CONFLICT (kind, key) "
                               "DO UPDATE SET value = excluded.value", kind, key, value)

    async def update_record(self, kind: str, key: str, change: Callable[[bytes], bytes]) -> bytes:
        """Read, change and write one record in one transaction that holds the record's row lock, so updates from
        several brokers apply one after another and none is lost. `change` gets the stored value (b"": none) and
        returns the new one (b"": delete it), which is returned; if it raises, nothing changes."""
        async with self.pool.acquire() as conn, conn.transaction():
            # A row to lock even when there is none yet: concurrent inserts wait on its key until this one commits.
            await conn.execute("INSERT INTO kop_record VALUES ($1, $2, $3) ON CONFLICT (kind, key) DO NOTHING",
                               kind, key, b"")
            old = await conn.fetchval("SELECT value FROM kop_record WHERE kind = $1 AND key = $2 FOR UPDATE",
                                      kind, key)
            new = change(bytes(old))
            if new:
                await conn.execute("UPDATE kop_record SET value = $3 WHERE kind = $1 AND key = $2", kind, key, new)
            else:
                await conn.execute("DELETE FROM kop_record WHERE kind = $1 AND key = $2", kind, key)
            return new

    async def delete_record(self, kind: str, key: str, fence: tuple[str, int] | None = None) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            if fence is not None:
                await self._check_owner(conn, *fence)
            await conn.execute("DELETE FROM kop_record WHERE kind = $1 AND key = $2", kind, key)

    # ---- settings the cluster's brokers share (users, ACLs, quotas, geo clusters): records of versioned kinds

    async def record_versions(self) -> dict[str, int]:
        """kind -> version, for the kinds set up in the database."""
        async with self.pool.acquire() as conn:
            return {r[0]: r[1] for r in await conn.fetch("SELECT kind, version FROM kop_record_version")}

    async def change_records(self, kind: str, puts: dict[str, bytes], deletes: list[str]) -> None:
        """Write and delete records of a versioned kind, raising its version, in one transaction."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_RAISE_VERSION, kind)  # first: the row lock orders concurrent changes of the kind
            if puts:
                await conn.execute("INSERT INTO kop_record SELECT $1, k, v FROM unnest($2::text[], $3::bytea[]) "
                                   "AS u(k, v) ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value",
                                   kind, list(puts), list(puts.values()))
            if deletes:
                await conn.execute("DELETE FROM kop_record WHERE kind = $1 AND key = ANY($2::text[])", kind, deletes)

    async def seed_records(self, kind: str, records: dict[str, bytes]) -> bool:
        """Set a versioned kind up with these records, unless it is set up already; whether it was not."""
        async with self.pool.acquire() as conn, conn.transaction():
            new = await conn.fetchval("INSERT INTO kop_record_version VALUES ($1, 1) ON CONFLICT (kind) DO NOTHING "
                                      "RETURNING 1", kind)
            if new is None:
                return False
            await conn.execute("DELETE FROM kop_record WHERE kind = $1", kind)  # none but a stray one, unversioned
            if records:
                await conn.execute("INSERT INTO kop_record SELECT $1, k, v FROM unnest($2::text[], $3::bytea[]) "
                                   "AS u(k, v)", kind, list(records), list(records.values()))
        return True

