"""One function per fault kind: each starts the fault, holds it for its duration, and ends it."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from integration.broker_process import BrokerProcess
from integration.fault_proxy import CutPolicy, FaultProxy
from integration.small_disk import Filler
from integration.soak.storage_faults import StorageFaultRecord, cursor_fail, dedup_flip, full_disk_restart, \
    torn_write


@dataclass
class Target:
    """What the faults act on."""

    broker: BrokerProcess
    proxy: FaultProxy
    topics: list[str]
    filler: Filler | None  # None: the data directory is not on a disk of its own, so no disk-full episodes
    stream_topics: list[str] = field(default_factory=list)  # the idempotent producers' (deduplication flips there)
    partitions: int = 1  # of every topic
    record: StorageFaultRecord = field(default_factory=StorageFaultRecord)


def cut(target: Target, duration: float) -> None:
    """Cut every third Produce response's connection for a while: the batches are stored, the clients retry."""
    target.proxy.set_policy(CutPolicy(every=3, max_cuts=1000))
    time.sleep(duration)
    target.proxy.set_policy(None)


def kill(target: Target, duration: float) -> None:
    """kill -9, stay down for the duration, start again on the same port and data."""
    target.broker.kill()
    time.sleep(duration)
    target.broker.start(timeout=120)


def pause(target: Target, duration: float) -> None:
    os.kill(target.broker.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(duration)
    finally:
        os.kill(target.broker.proc.pid, signal.SIGCONT)


def disk_full(target: Target, duration: float) -> None:
    assert target.filler is not None
    try:
        target.filler.fill()
        time.sleep(duration)
    finally:
        target.filler.remove()


FAULTS: dict[str, Callable[[Target, float], None]] = {
    "cut": cut, "kill": kill, "pause": pause, "disk_full": disk_full, "dedup_flip": dedup_flip,
    "cursor_fail": cursor_fail, "torn_write": torn_write, "full_disk_restart": full_disk_restart}
NEED_DISK = {"disk_full", "full_disk_restart"}  # kinds that need the data directory on a disk of its own
# Kinds that need the file engine: its ledger files' write step, its cursor logs, its data on the broker's own disk
# (on PostgreSQL a full broker disk holds nothing the broker writes)
NEED_FILES = {"torn_write", "cursor_fail", "disk_full", "full_disk_restart"}
