"""Wire the soak together: a broker behind a fault proxy (its data on a tmpfs of its own when one can be mounted),
one idempotent producer per client, a consumer group over all their topics with one member per client, the seeded
schedule of faults, then the checker's verdict per producing and per consuming client; and a transactional
producer through the same faults, with its own verdict."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from integration.broker_process import BrokerProcess
from integration.fault_proxy import FaultProxy
from integration.idem_raw import RawKafka, read_topic
from integration.small_disk import Filler, mount_refused_reason, unmount
from integration.soak.checker import ClientVerdict, ConsumerVerdict, judge, judge_members
from integration.soak.consumers import MEMBERS, CommitWatcher
from integration.soak.faults import FAULTS, NEED_DISK, Target
from integration.soak.producers import DELIVERY_TIMEOUT_S, PRODUCERS
from integration.soak.schedule import Step, plan
from integration.soak.storage_faults import StorageFaultRecord, excuse_dedup_off_copies
from integration.soak.transactions import TransactionalProducer, TxnVerdict, judge_transactions
from integration.waiting import wait_until
from protocol.errors import ErrorCode

PARTITIONS = 4  # as many as members at most: the range assignor leaves none of them without partitions
GROUP = "soak-readers"
TXN_TOPIC = "soak-transactions"
DISK_MB = 256
CATCH_UP_S = 120  # after the last fault, for the group to commit the end of every partition


@dataclass(frozen=True)
class SoakResult:
    seed: int
    steps: list[Step]
    verdicts: list[ClientVerdict]
    members: list[ConsumerVerdict]
    transactions: TxnVerdict
    skipped: list[str]  # fault kinds left out, with the reason
    # Controls, that the faults happened: assignments beyond each member's first (the group noticed), Produce
    # responses the proxy cut, the broker's ENOSPC log lines, its log lines of injected cursor-log failures, and
    # what the storage faults recorded (deduplication flips, starts on a full disk).
    rebalances: int
    cuts: int
    enospc: int
    injected_failures: int = 0
    storage: StorageFaultRecord = field(default_factory=StorageFaultRecord)
    excused: dict[str, int] = field(default_factory=dict)  # per client: copies stored while deduplication was off

    @property
    def ok(self) -> bool:
        return all(v.ok for v in [*self.verdicts, *self.members, self.transactions])

    def report(self) -> str:
        lines = [v.summary() for v in [*self.verdicts, *self.members, self.transactions]]
        lines.append(f"faults={len(self.steps)} rebalances={self.rebalances} cuts={self.cuts} "
                     f"enospc={self.enospc} injected_failures={self.injected_failures} "
                     f"dedup_flips={self.storage.flips} excused_while_dedup_off={self.excused} "
                     f"full_disk_starts refused={self.storage.full_disk_refusals} "
                     f"started={self.storage.full_disk_starts} skipped={self.skipped}")
        lines.append(f"{'PASSED' if self.ok else 'FAILED'}: replay with --seed {self.seed}")
        return "\n".join(lines)


def run_soak(work_dir: str, seconds: float, seed: int, clients: list[str] | None = None,
             say: Callable[[str], None] = print, broker_config: dict[str, str] | None = None,
             faults: list[str] | None = None) -> SoakResult:
    """broker_config: more broker settings (properties-file keys), e.g. a control run with deduplication off;
    faults: the kinds the schedule draws from (default every kind)."""
    clients = clients or list(PRODUCERS)
    data = os.path.join(work_dir, "data")
    no_disk = mount_refused_reason(data, DISK_MB)
    wanted = faults or list(FAULTS)
    kinds = [k for k in wanted if k not in NEED_DISK or no_disk is None]
    skipped = [] if no_disk is None else [f"{k}: {no_disk}" for k in wanted if k in NEED_DISK]
    steps = plan(seed, seconds, kinds)
    say(f"soak seed={seed} seconds={seconds} clients={clients} work dir={work_dir}")
    say("\n".join(map(str, steps)) or "(no faults fit)")
    broker = None
    try:
        with FaultProxy() as proxy:
            broker = BrokerProcess(data, admin_port=0,
                                   config={**(broker_config or {}), "advertised.port": str(proxy.port),
                                           "adminFailpointsEnabled": "true"})
            broker.start()
            proxy.upstream_port = broker.port
            topics = {client: f"soak-{client}" for client in clients}
            with RawKafka(broker.port) as kafka:
                for topic in [*topics.values(), TXN_TOPIC]:
                    assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
            target = Target(broker, proxy, [*topics.values(), TXN_TOPIC], Filler(data) if no_disk is None else None,
                            stream_topics=list(topics.values()), partitions=PARTITIONS)
            verdicts, members, transactions, excused = _drive(target, topics, steps, seconds, seed, say)
            cuts = proxy.stats().cuts
        with open(broker.log_path, encoding="utf-8", errors="replace") as log:
            lines = log.readlines()
        enospc = sum(1 for line in lines if "No space left on device" in line)
        injected = sum(1 for line in lines if "injected write failure" in line)
        rebalances = sum(m.rebalances for m in members)
        return SoakResult(seed, steps, verdicts, members, transactions, skipped, rebalances, cuts, enospc, injected,
                          target.record, excused)
    finally:
        if broker is not None:
            broker.stop()
        if no_disk is None:
            unmount(data)


def _drive(target: Target, topics: dict[str, str], steps: list[Step], seconds: float, seed: int,
           say: Callable[[str], None]
           ) -> tuple[list[ClientVerdict], list[ConsumerVerdict], TxnVerdict, dict[str, int]]:
    bootstrap = target.proxy.bootstrap
    producers = [PRODUCERS[client](bootstrap, topic) for client, topic in topics.items()]
    txn_producer = TransactionalProducer(bootstrap, TXN_TOPIC, PARTITIONS, seed)
    writers = [*producers, txn_producer]
    lifetime = seconds + DELIVERY_TIMEOUT_S + CATCH_UP_S + 120  # a bound in case stop() is never heard
    members = [MEMBERS[client](bootstrap, GROUP, topics.values(), client, lifetime)
               for client in topics if client in MEMBERS]
    watcher = CommitWatcher(bootstrap, GROUP, [(t, p) for t in topics.values() for p in range(PARTITIONS)])
    threads = [*writers, *members, watcher]
    for thread in threads:
        thread.start()
    try:
        started = time.monotonic()
        for step in steps:
            time.sleep(max(0.0, started + step.at - time.monotonic()))
            say(f"fault {step}")
            FAULTS[step.kind](target, step.duration)
        time.sleep(max(0.0, started + seconds - time.monotonic()))
        for writer in writers:
            writer.stop()
        for writer in writers:
            writer.join(DELIVERY_TIMEOUT_S + 30)
        with RawKafka(target.broker.port) as kafka:
            ends = {t: kafka.end_offsets(t, range(PARTITIONS)) for t in topics.values()}
        transactions = judge_transactions(txn_producer, target.broker.port, bootstrap)
        wait_until(lambda: all(watcher.latest.get((t, p), -1) >= end for t, e in ends.items()
                               for p, end in e.items()), timeout=CATCH_UP_S, interval=0.5)
    finally:
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(30)
    received = set().union(*(m.received for m in members))
    verdicts = []
    excused: dict[str, int] = {}
    for producer in producers:
        topic = producer.topic
        stored, excused[producer.client] = excuse_dedup_off_copies(
            topic, read_topic(target.broker.port, topic, range(PARTITIONS)), producer.reports,
            target.record.off_windows)
        committed = {p: o for (t, p), o in watcher.latest.items() if t == topic}
        backwards = [(p, a, b) for t, p, a, b in watcher.backwards if t == topic]
        verdicts.append(judge(producer, stored, received, committed, ends[topic], backwards))
    all_ends = {(t, p): end for t, e in ends.items() for p, end in e.items()}
    return verdicts, judge_members(members, watcher.latest, all_ends, watcher.backwards), transactions, excused
