"""One broker behind a fault proxy, its data on a tmpfs of its own when one can be mounted: the soak's first
deployment, with every fault kind of faults.py and storage_faults.py."""
from __future__ import annotations

import functools
import os
from collections.abc import Iterable

from integration import broker_process
from integration.broker_process import BrokerProcess
from integration.fault_proxy import FaultProxy
from integration.idem_raw import RawKafka, StoredRecord, read_topic
from integration.small_disk import Filler, mount_refused_reason, unmount
from integration.soak.deployment import Deployment, Fault, count_lines
from integration.soak.faults import FAULTS, NEED_DISK, NEED_FILES, Target
from protocol.errors import ErrorCode

DISK_MB = 256


def _on_files() -> bool:
    """Whether the brokers run on the file engine (the session's engine under pytest --storage)."""
    return broker_process.new_postgres_database is None


class SingleBroker(Deployment):
    def __init__(self, work_dir: str, broker_config: dict[str, str] | None = None) -> None:
        self.data = os.path.join(work_dir, "data")
        self.no_disk = mount_refused_reason(self.data, DISK_MB)  # None: mounted
        self.proxy = FaultProxy().start()
        self.broker = BrokerProcess(self.data, admin_port=0,
                                    config={**(broker_config or {}), "advertised.port": str(self.proxy.port),
                                            "adminFailpointsEnabled": "true"})
        self.target = Target(self.broker, self.proxy, [], None if self.no_disk else Filler(self.data))
        try:
            self.broker.start()
        except BaseException:
            self.close()
            raise
        self.proxy.upstream_port = self.broker.port
        self.bootstrap = self.proxy.bootstrap

    def skipped(self, wanted: Iterable[str]) -> list[str]:
        """The wanted kinds this machine cannot run, with the reason."""
        no_files = None if _on_files() else "the brokers run on PostgreSQL: no ledger files or cursor logs on disk"
        return [f"{k}: {why}" for k in wanted for needs, why in ((NEED_DISK, self.no_disk), (NEED_FILES, no_files))
                if k in needs and why is not None]

    def faults(self) -> dict[str, Fault]:
        return {kind: functools.partial(fault, self.target) for kind, fault in FAULTS.items()
                if (kind not in NEED_DISK or self.no_disk is None) and (kind not in NEED_FILES or _on_files())}

    def create_topics(self, topics: Iterable[str], partitions: int) -> None:
        with RawKafka(self.broker.port) as kafka:
            for topic in topics:
                assert kafka.create_topic(topic, partitions) == ErrorCode.NONE, topic
                self.target.topics.append(topic)
        self.target.partitions = partitions

    def end_offsets(self, topic: str, partitions: range, committed: bool = False) -> dict[int, int]:
        with RawKafka(self.broker.port, timeout=60) as kafka:
            return kafka.end_offsets(topic, partitions, committed)

    def read(self, topic: str, partitions: range) -> list[StoredRecord]:
        return read_topic(self.broker.port, topic, partitions)

    def controls(self) -> dict[str, int]:
        record = self.target.record
        logs = [self.broker.log_path]
        torn = count_lines(logs, "(a torn write)")  # its lines also say "injected write failure"
        return {"cuts": self.proxy.stats().cuts,
                "enospc": count_lines(logs, "No space left on device"),
                "injected_failures": count_lines(logs, "injected write failure") - torn,
                "torn_writes": torn,
                "dedup_flips": record.flips, "full_disk_refusals": record.full_disk_refusals,
                "full_disk_starts": record.full_disk_starts}

    def close(self) -> None:
        try:
            self.broker.stop()
            self.proxy.stop()
        finally:
            if self.no_disk is None:
                unmount(self.data)
