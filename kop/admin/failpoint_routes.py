"""Fault injection for tests, only when the broker runs with `admin_failpoints_enabled` (404 otherwise).

`POST /admin/v2/kop/failpoints/{topic}/{partition}` with `{"write_failures": n}` makes the next n flushes of that
partition's ledger fail as a disk error would, so the fencing path runs inside a real broker under real clients;
`{"hold_flushes": true}` stalls that ledger's flushes in their worker thread, as a stuck disk would, until
`{"hold_flushes": false}` (or a two-minute limit) releases them; `{"replay_read_failures": n}` makes the next n
reads of the dedup replay fail as a disk read error would, so a dedup recovery fails and is retried;
`{"cursor_write_failures": n}` makes the next n flushes of the partition's cursor log fail (group offsets, the dedup
and transaction snapshots); `{"txn_index_write_failures": n}` makes the next n writes of a closed ledger's
aborted-transaction index fail (it stays in memory and in the transaction snapshots); `{"append_failures": n}`
makes the next n appends to the partition's ledger file (the file engine's write step, before the flush) write half
their record and fail with EIO, as a disk error part-way through a write would;
`{"crash_before_cleaned_through": true}` kills the broker (SIGKILL) the next time the log cleaner, having installed a
pass's rewrites of that partition, is about to record how far it got (on PostgreSQL, where both are one
transaction, inside it before it commits).
"""
from collections.abc import Callable
from typing import TYPE_CHECKING

from kop.admin.http import HttpError, Request, Response, json_response
from kop.admin.parsing import int_value, json_body
from kop.admin.router import AdminRouter

if TYPE_CHECKING:
    from kop.broker import Broker

PATH = "/admin/v2/kop/failpoints/{topic}/{partition}"
MAX_FAILURES = 1_000_000
FAILPOINTS = frozenset({"write_failures", "replay_read_failures", "hold_flushes", "cursor_write_failures",
                        "txn_index_write_failures", "append_failures", "crash_before_cleaned_through"})


class FailpointRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        if self.broker.config.admin_failpoints_enabled:
            router.add("POST", PATH, self.inject)

    async def inject(self, request: Request, topic: str, partition: str) -> Response:
        body = json_body(request)
        if not isinstance(body, dict) or not body or not set(body) <= FAILPOINTS:
            raise HttpError(400, 'expected {"write_failures": n}, {"replay_read_failures": n}, '
                                 '{"cursor_write_failures": n}, {"txn_index_write_failures": n}, '
                                 '{"append_failures": n}, {"crash_before_cleaned_through": true} and/or '
                                 '{"hold_flushes": true|false}')
        count = int_value(body.get("write_failures", 0), "write_failures", 0, MAX_FAILURES)
        read_failures = int_value(body.get("replay_read_failures", 0), "replay_read_failures", 0, MAX_FAILURES)
        cursor_failures = int_value(body.get("cursor_write_failures", 0), "cursor_write_failures", 0, MAX_FAILURES)
        index_failures = int_value(body.get("txn_index_write_failures", 0), "txn_index_write_failures", 0,
                                   MAX_FAILURES)
        append_failures = int_value(body.get("append_failures", 0), "append_failures", 0, MAX_FAILURES)
        hold = body.get("hold_flushes")
        if hold is not None and not isinstance(hold, bool):
            raise HttpError(400, f"hold_flushes must be true or false, got {hold!r}")
        crash = body.get("crash_before_cleaned_through")
        if crash is not None and crash is not True:
            raise HttpError(400, f"crash_before_cleaned_through must be true, got {crash!r}")
        if not partition.isdigit():
            raise HttpError(400, f"partition must be a number, got {partition!r}")
        target = self.broker.topics.partition(topic, int(partition))
        if target is None:
            raise HttpError(404, f"no partition {topic}-{partition}")
        target.ledger.inject_write_failures(count)
        target.ledger.inject_replay_read_failures(read_failures)
        target.ledger.inject_txn_index_write_failures(index_failures)
        _engine_failpoint("cursor_write_failures", target.ledger.inject_cursor_write_failures, cursor_failures)
        _engine_failpoint("append_failures", target.ledger.inject_append_failures, append_failures)
        if crash:
            try:
                target.ledger.inject_crash_before_cleaned_through()
            except NotImplementedError as exc:
                raise HttpError(400, f"crash_before_cleaned_through: {exc}") from None
        if hold is not None:
            target.ledger.hold_flushes(hold)
        return json_response({"topic": topic, "partition": int(partition), **body})


def _engine_failpoint(name: str, inject: Callable[[int], None], count: int) -> None:
    """A failpoint only some storage engines have: 400 where this one has not."""
    if count:
        try:
            inject(count)
        except NotImplementedError as exc:
            raise HttpError(400, f"{name}: {exc}") from None
