"""Fault kinds on the broker's storage and policies, each with what it records as its control:

- `dedup_flip`: deduplication itself turned off on the idempotent streams' topics (the topic policy, through the
  admin API, while the broker runs), held, then turned on again and waited for until every partition's state is
  recovered. While it is off a retried batch is stored again, as Pulsar stores it: the checker excuses a stored
  copy only when it lies in a window of offsets written while it was off (`OffWindow`), and counts it.
- `cursor_fail`: the next flushes of every partition's cursor log fail with EIO (the `cursor_write_failures`
  failpoint): group offset commits and dedup snapshots they carried fail, and are retried.
- `torn_write`: the next append to every partition's ledger file writes half its record and fails with EIO (the
  `append_failures` failpoint): the batch is refused with a retriable error, the half record cut off, and the
  producers' retries stored once.
- `full_disk_restart`: kill -9, the disk filled, a start attempted on it (refused in one line, or started), held,
  then the space freed and the broker started: a restart that meets a full disk loses nothing.
"""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from integration.idem_raw import RawKafka, StoredRecord
from integration.idem_stream import Report
from kop.admin.client import AdminClient, topic_resource

CURSOR_FAILURES = 2  # per partition: the next two flushes of its cursor log
TORN_WRITES = 1  # per partition: its next append
READY_S = 120


@dataclass(frozen=True, slots=True)
class OffWindow:
    """Offsets [start, end) of a partition written while deduplication was off (end read once it was on again and
    recovered, so everything judged while it was off lies below it)."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass
class StorageFaultRecord:
    """What the faults of this module did: the controls that they happened."""

    off_windows: list[OffWindow] = field(default_factory=list)
    flips: int = 0
    cursor_failures_injected: int = 0
    torn_writes_injected: int = 0
    full_disk_refusals: int = 0  # starts on the full disk refused (exit status 2, one line)
    full_disk_starts: int = 0  # starts on the full disk that went through


def dedup_flip(target, duration: float) -> None:
    admin = AdminClient(target.broker.admin_url)
    topics, partitions = target.stream_topics, range(target.partitions)
    before = _ends(target, topics, partitions)
    for topic in topics:
        admin.post(topic_resource(topic, "deduplicationEnabled"), False)
    try:
        time.sleep(duration)
    finally:
        for topic in topics:
            admin.delete(topic_resource(topic, "deduplicationEnabled"))
    _wait_ready(target.broker.admin_url)
    after = _ends(target, topics, partitions)
    target.record.off_windows.extend(OffWindow(t, p, before[t][p], after[t][p]) for t in topics for p in partitions)
    target.record.flips += 1


def cursor_fail(target, duration: float) -> None:
    target.record.cursor_failures_injected += _every_partition(target, "cursor_write_failures", CURSOR_FAILURES)
    time.sleep(duration)


def torn_write(target, duration: float) -> None:
    target.record.torn_writes_injected += _every_partition(target, "append_failures", TORN_WRITES)
    time.sleep(duration)


def _every_partition(target, failpoint: str, count: int) -> int:
    """Arm `failpoint` with `count` on every partition of the soak's topics; how many failures that armed."""
    admin = AdminClient(target.broker.admin_url)
    armed = 0
    for topic in target.topics:
        for p in range(target.partitions):
            admin.post(f"/admin/v2/kop/failpoints/{topic}/{p}", {failpoint: count})
            armed += count
    return armed


def full_disk_restart(target, duration: float) -> None:
    assert target.filler is not None
    target.broker.kill()
    target.filler.fill()
    try:
        try:
            target.broker.start(timeout=60)
            target.record.full_disk_starts += 1
        except RuntimeError as exc:
            if "exited with 2" not in str(exc):
                raise
            target.record.full_disk_refusals += 1
        time.sleep(duration)
    finally:
        target.filler.remove()
    if target.broker.proc is None or target.broker.proc.poll() is not None:
        target.broker.start(timeout=120)


def excuse_dedup_off_copies(topic: str, stored: list[StoredRecord], reports: list[Report],
                            windows: list[OffWindow]) -> tuple[list[StoredRecord], int]:
    """`topic`'s `stored` records without the copies deduplication being off explains, and how many those were. A
    value's copies are explained when every copy after its first lies in an off window of its partition; one copy is
    kept (the one its producer was told, if it was told one of them)."""
    spans = defaultdict(list)
    for w in windows:
        if w.topic == topic:
            spans[w.partition].append((w.start, w.end))
    if not spans:
        return stored, 0
    acked = {r.value: (r.partition, r.offset) for r in reports if r.error is None and r.offset is not None}
    copies: dict[bytes | None, list[StoredRecord]] = defaultdict(list)
    for record in stored:
        copies[record.value].append(record)
    drop: set[int] = set()
    for value, records in copies.items():
        if len(records) < 2:
            continue
        records = sorted(records, key=lambda r: (r.partition, r.offset))
        if not all(any(start <= r.offset < end for start, end in spans[r.partition]) for r in records[1:]):
            continue
        keep = next((r for r in records if (r.partition, r.offset) == acked.get(value)), records[0])
        drop.update(id(r) for r in records if r is not keep)
    return [r for r in stored if id(r) not in drop], len(drop)


def _ends(target, topics: list[str], partitions: range) -> dict[str, dict[int, int]]:
    with RawKafka(target.broker.port, timeout=60) as kafka:
        return {topic: kafka.end_offsets(topic, partitions) for topic in topics}


def _wait_ready(admin_url: str) -> None:
    """Until /ready answers 200: every partition's deduplication state is recovered."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(admin_url + "/ready", timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the broker was not ready {READY_S} s after deduplication was turned on again")
