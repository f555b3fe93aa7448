"""A broker's membership of the cluster: a kop_broker row with a lease it renews, by the database's clock.

A broker registers under its node id with a new session number and its advertised endpoints, and renews its lease
every heartbeat. One that stops renewing (killed, paused, cut off) is dead once its lease runs out: the others stop
counting it, and its writes are refused from then on (every write checks the session's lease, kop/ledger/postgres).
A broker that finds its lease expired (it was paused) registers again under a new session, as after a restart.

A node id belongs to one broker home (host and data directory): a restart of the same broker, even after kill -9,
takes its row over at once; another broker configured with the same id is refused while the first one's lease lasts.
"""
import json
import logging
from dataclasses import dataclass

from kop.ledger.postgres import PgStore
from kop.startup import StartupError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Member:
    node_id: int
    endpoints: dict[str, tuple[str, int]]  # listener name -> (host, port) clients are told


class NodeIdInUse(StartupError):
    """Another broker holds a live lease on this node id."""


_LEASE = "clock_timestamp() + $2 * interval '1 millisecond'"


class Membership:
    def __init__(self, store: PgStore, me: Member, home: str, lease_ms: int) -> None:
        self._store = store
        self.me = me
        self._home = home
        self._lease_ms = lease_ms

    async def register(self) -> int:
        """Register (again) under a new session; its number. NodeIdInUse while another home holds the id."""
        async with self._store.pool.acquire() as conn, conn.transaction():
            held = await conn.fetchrow("SELECT home, lease_until > clock_timestamp() AS live FROM kop_broker "
                                       "WHERE node_id = $1 FOR UPDATE", self.me.node_id)
            if held is not None and held["live"] and held["home"] != self._home:
                raise NodeIdInUse(f"node.id {self.me.node_id} is in use by a live broker on this database "
                                  f"({held['home']}): give each broker its own node.id")
            session = await conn.fetchval("SELECT nextval('kop_broker_session')")
            await conn.execute(
                "INSERT INTO kop_broker (node_id, session, home, endpoints, lease_until) "
                f"VALUES ($1, $3, $4, $5, {_LEASE}) ON CONFLICT (node_id) DO UPDATE SET session = $3, home = $4, "
                f"endpoints = $5, lease_until = {_LEASE}",
                self.me.node_id, self._lease_ms, session, self._home, json.dumps(self.me.endpoints))
        self._store.session = session
        return session

    async def renew(self) -> bool:
        """Extend the lease; False when it had run out already (the session is over: register again)."""
        async with self._store.pool.acquire() as conn:
            renewed = await conn.fetchval(
                f"UPDATE kop_broker SET lease_until = {_LEASE} WHERE node_id = $1 AND session = $3 "
                "AND lease_until > clock_timestamp() RETURNING 1", self.me.node_id, self._lease_ms,
                self._store.session)
        return renewed is not None

    async def live(self) -> list[Member]:
        """The brokers whose lease has not run out, by node id."""
        async with self._store.pool.acquire() as conn:
            rows = await conn.fetch("SELECT node_id, endpoints FROM kop_broker WHERE lease_until > clock_timestamp() "
                                    "ORDER BY node_id")
        return [Member(row["node_id"], {name: (host, port) for name, (host, port) in json.loads(row["endpoints"]).items()})
                for row in rows]

    async def leave(self) -> None:
        """End the lease now (a clean stop): the other brokers take this one's partitions over at their next beat."""
        async with self._store.pool.acquire() as conn:
            await conn.execute("DELETE FROM kop_broker WHERE session = $1", self._store.session)
        self._store.session = None
