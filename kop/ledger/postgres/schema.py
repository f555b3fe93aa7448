"""The PostgreSQL engine's schema, created and migrated by kop itself.

MIGRATIONS[i] brings a database from version i to i + 1; `migrate` applies the missing ones in one transaction under
an advisory lock, so brokers starting together migrate once. A database newer than this kop is refused: an older
broker must not write rows whose meaning it does not know.
"""
import asyncpg

from kop.startup import StartupError

MIGRATION_LOCK = 0x6B6F70  # pg_advisory_xact_lock key: "kop"

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE kop_managed_ledger (
        name text PRIMARY KEY,
        epoch bigint NOT NULL,              -- the owner's fencing epoch: every write checks it
        last_ledger_id bigint NOT NULL,     -- ledger ids never go back
        end_floor bigint NOT NULL,          -- one past the last offset ever confirmed
        deleted_before bigint NOT NULL      -- DeleteRecords' low watermark
    );
    CREATE TABLE kop_ledger (
        name text NOT NULL REFERENCES kop_managed_ledger ON DELETE CASCADE,
        ledger_id bigint NOT NULL,
        closed_ms bigint,                   -- newest record's time once closed; NULL while current
        PRIMARY KEY (name, ledger_id)
    );
    -- One row per entry: the framed entry bytes of the file engine (offsets, MessageMetadata, record batch). The
    -- primary key is the offset index: the entry holding an offset is found without a scan.
    CREATE TABLE kop_entry (
        name text NOT NULL,
        first_index bigint NOT NULL,
        ledger_id bigint NOT NULL,
        entry_id integer NOT NULL,
        entry bytea NOT NULL,
        PRIMARY KEY (name, first_index)
    );
    ALTER TABLE kop_entry ALTER COLUMN entry SET STORAGE EXTERNAL;  -- batches are compressed by producers already
    CREATE INDEX kop_entry_position ON kop_entry (name, ledger_id, entry_id);
    CREATE TABLE kop_cursor (
        name text NOT NULL REFERENCES kop_managed_ledger ON DELETE CASCADE,
        cursor text NOT NULL,
        info bytea NOT NULL,                -- ManagedCursorInfo: position and properties, one atomic unit
        PRIMARY KEY (name, cursor)
    );
    -- Small broker records kept whole (topic metadata, ...), by kind and key.
    CREATE TABLE kop_record (
        kind text NOT NULL,
        key text NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY (kind, key)
    );
    """,
    # 2: counters shared by every broker on the database (producer-id blocks)
    """
    CREATE TABLE kop_counter (
        name text PRIMARY KEY,
        value bigint NOT NULL
    );
    """,
    # 3: entries are keyed by their position. A PIP-33 marker covers no offset, so it shares its first offset with
    # the entry after it: keyed by the offset, the second of the two could never be stored.
    """
    ALTER TABLE kop_entry DROP CONSTRAINT kop_entry_pkey;
    DROP INDEX kop_entry_position;
    ALTER TABLE kop_entry ADD PRIMARY KEY (name, ledger_id, entry_id);
    """,
    # 4: several brokers on one database: their leases, and which run of which broker owns each managed ledger
    """
    CREATE TABLE kop_broker (
        node_id integer PRIMARY KEY,
        session bigint NOT NULL UNIQUE,     -- this run of the broker: a restarted or resumed one registers anew
        home text NOT NULL,                 -- host and data directory: a second broker with the same id is refused
        endpoints text NOT NULL,            -- JSON: listener name -> [host, port], as clients are told
        lease_until timestamptz NOT NULL    -- the database's clock: brokers' clocks never matter
    );
    CREATE SEQUENCE kop_broker_session;
    ALTER TABLE kop_managed_ledger ADD COLUMN owner_session bigint;
    """,
    # 5: settings every broker of the cluster shares (users, ACLs, quotas, geo clusters) are records whose kind has
    # a version, raised by each change in its transaction: a broker reads a kind again only when it moved. A kind
    # with a version has been set up in the database (a broker moving there copies its own only into one without).
    """
    CREATE TABLE kop_record_version (
        kind text PRIMARY KEY,
        version bigint NOT NULL
    );
    """,
    # 6: a closed ledger's aborted-transaction index (kop/transactions' bytes), deleted with its ledger's row
    """
    ALTER TABLE kop_ledger ADD COLUMN txn_index bytea;
    """,
    # 7: entries by first offset, for the entry before a committed offset (cluster offset commits): without it that
    # lookup scanned every entry of the partition. Positions break ties: a marker shares its first offset.
    """
    CREATE INDEX kop_entry_first_index ON kop_entry (name, first_index, ledger_id, entry_id);
    """,
    # 8: log compaction: the last ledger the cleaner compacted, written in the transaction that stores its rewrites
    """
    ALTER TABLE kop_managed_ledger ADD COLUMN cleaned_through bigint NOT NULL DEFAULT -1;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


async def migrate(conn: asyncpg.Connection) -> int:
    """Bring the database to SCHEMA_VERSION; returns the version it had."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute("CREATE TABLE IF NOT EXISTS kop_schema (version integer NOT NULL)")
        found = await conn.fetchval("SELECT version FROM kop_schema")
        if found is None:
            await conn.execute("INSERT INTO kop_schema VALUES (0)")
            found = 0
        if found > SCHEMA_VERSION:
            raise StartupError(f"the PostgreSQL schema is version {found}, newer than this kop's {SCHEMA_VERSION}: "
                               "run a kop at least as new as the one that migrated it")
        for sql in MIGRATIONS[found:]:
            await conn.execute(sql)
        await conn.execute("UPDATE kop_schema SET version = $1", SCHEMA_VERSION)
    return found
