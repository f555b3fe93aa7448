"""Wire the soak together: the clients (one idempotent producer per client library, a consumer group over all
their topics with one member per client, the group's committed-offset watcher, a transactional producer) against a
deployment, the seeded schedule of its faults, then the checker's verdict per producing and per consuming client
and on the transactions. `run_soak` runs it against one broker; geo.py and cluster.py against their deployments."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from integration.idem_raw import StoredRecord
from integration.soak.checker import ClientVerdict, ConsumerVerdict, judge, judge_members
from integration.soak.consumers import MEMBERS, CommitWatcher, GroupMember
from integration.soak.deployment import Deployment
from integration.soak.faults import FAULTS
from integration.soak.producers import DELIVERY_TIMEOUT_S, PRODUCERS, RATE_PER_S, StreamProducer
from integration.soak.schedule import Step, plan
from integration.soak.single import SingleBroker
from integration.soak.storage_faults import StorageFaultRecord, excuse_dedup_off_copies
from integration.soak.transactions import TransactionalProducer, TxnVerdict, judge_transactions
from integration.waiting import wait_until

PARTITIONS = 4  # as many as members at most: the range assignor leaves none of them without partitions
GROUP = "soak-readers"
TXN_TOPIC = "soak-transactions"
CATCH_UP_S = 120  # after the last fault, for the group to commit the end of every partition


class Verdict(Protocol):
    """Any further check a deployment adds (geo: the replicas, the group's failover): ok and a line."""

    @property
    def ok(self) -> bool: ...

    def summary(self) -> str: ...


@dataclass(frozen=True)
class SoakResult:
    topology: str
    seed: int
    steps: list[Step]
    verdicts: list[ClientVerdict]
    members: list[ConsumerVerdict]
    transactions: list[TxnVerdict]
    skipped: list[str]  # fault kinds left out, with the reason
    # Controls, that the faults happened: counted by the deployment (responses the proxies cut, kills, log lines of
    # a fault), and the group's rebalances (assignments beyond each member's first: the group noticed).
    controls: dict[str, int]
    checks: list[Verdict] = field(default_factory=list)
    storage: StorageFaultRecord = field(default_factory=StorageFaultRecord)
    excused: dict[str, int] = field(default_factory=dict)  # per client: copies stored while deduplication was off

    @property
    def ok(self) -> bool:
        return all(v.ok for v in [*self.verdicts, *self.members, *self.transactions, *self.checks])

    def report(self) -> str:
        lines = [v.summary() for v in [*self.verdicts, *self.members, *self.transactions, *self.checks]]
        controls = " ".join(f"{k}={v}" for k, v in self.controls.items())
        lines.append(f"topology={self.topology} faults={len(self.steps)} {controls} "
                     f"excused_while_dedup_off={self.excused} skipped={self.skipped}")
        lines.append(f"{'PASSED' if self.ok else 'FAILED'}: replay with --seed {self.seed}")
        return "\n".join(lines)


@dataclass
class Load:
    """The clients of one run."""

    producers: list[StreamProducer]
    members: list[GroupMember]
    watcher: CommitWatcher
    txn: TransactionalProducer

    @property
    def writers(self) -> list[threading.Thread]:
        return [*self.producers, self.txn]

    @property
    def threads(self) -> list[threading.Thread]:
        return [*self.writers, *self.members, self.watcher]


@dataclass(frozen=True)
class Outcome:
    verdicts: list[ClientVerdict]
    members: list[ConsumerVerdict]
    transactions: TxnVerdict
    ends: dict[str, dict[int, int]]
    excused: dict[str, int]


def standard_load(bootstrap: str, clients: list[str], seed: int, seconds: float, rate: float = RATE_PER_S,
                  log_dir: str | None = None) -> Load:
    """A producer per client to soak-<client>, a member per client in GROUP over those topics, the transactional
    producer to TXN_TOPIC, all through `bootstrap`. log_dir: where members keep their clients' group logs."""
    topics = stream_topics(clients)
    lifetime = seconds + DELIVERY_TIMEOUT_S + CATCH_UP_S + 120  # a bound in case stop() is never heard
    members = [MEMBERS[client](bootstrap, GROUP, topics.values(), client, lifetime)
               for client in clients if client in MEMBERS]
    for member in members:
        member.log_dir = log_dir
    return Load(
        producers=[PRODUCERS[client](bootstrap, topics[client], rate=rate) for client in clients],
        members=members,
        watcher=CommitWatcher(bootstrap, GROUP, [(t, p) for t in topics.values() for p in range(PARTITIONS)]),
        txn=TransactionalProducer(bootstrap, TXN_TOPIC, PARTITIONS, seed))


def stream_topics(clients: list[str]) -> dict[str, str]:
    return {client: f"soak-{client}" for client in clients}


class UnknownFaults(ValueError):
    """Fault kinds asked for that the topology does not have."""


def choose_kinds(available: Iterable[str], wanted: list[str] | None, known: Iterable[str] | None = None
                 ) -> list[str]:
    """The kinds the schedule draws from: those wanted (default: every known one) that can run here. known: every
    kind of the topology, some of which may not run on this machine (default: those available)."""
    available = list(available)
    known = list(known or available)
    wanted = wanted or known
    unknown = [k for k in wanted if k not in known]
    if unknown:
        raise UnknownFaults(f"unknown fault kinds {unknown}: this topology has {known}")
    return [k for k in wanted if k in available]


def run_steps(dep: Deployment, steps: list[Step], seconds: float, say: Callable[[str], None]) -> None:
    """Each fault at its time, then quiet until `seconds` from now have passed."""
    faults = dep.faults()
    started = time.monotonic()
    for step in steps:
        time.sleep(max(0.0, started + step.at - time.monotonic()))
        say(f"fault {step}")
        faults[step.kind](step.duration)
    time.sleep(max(0.0, started + seconds - time.monotonic()))


def drive(dep: Deployment, load: Load, steps: list[Step], seconds: float, say: Callable[[str], None],
          stored_for: Callable[[StreamProducer], list[StoredRecord]] | None = None,
          off_windows: list | None = None, settle: Callable[[], None] | None = None) -> Outcome:
    """Run the load through the schedule, stop the writers, wait for the group to commit every partition's end,
    and judge. stored_for: what a producer's stream is judged against (default: its topic in `dep`, its values
    only; where producers share a topic, the holes its report counts are the others' records); off_windows:
    offsets written while deduplication was off (single broker); settle: called once the writers stopped, before
    the ends are read (geo: until the replicators caught up)."""
    topics = sorted({p.topic for p in load.producers})
    for thread in load.threads:
        thread.start()
    try:
        run_steps(dep, steps, seconds, say)
        for writer in load.writers:
            writer.stop()
        for writer in load.writers:
            writer.join(DELIVERY_TIMEOUT_S + 30)
        if settle is not None:
            settle()
        ends = {t: dep.end_offsets(t, range(PARTITIONS)) for t in topics}
        transactions = judge_transactions(load.txn, dep.end_offsets, dep.bootstrap)
        watcher = load.watcher
        wait_until(lambda: all(watcher.latest.get((t, p), -1) >= end for t, e in ends.items()
                               for p, end in e.items()), timeout=CATCH_UP_S, interval=0.5)
    finally:
        for thread in load.threads:
            thread.stop()
        for thread in load.threads:
            thread.join(30)
    received = set().union(*(m.received for m in load.members))
    stored_topics = {t: dep.read(t, range(PARTITIONS)) for t in topics}
    verdicts = []
    excused: dict[str, int] = {}
    for producer in load.producers:
        topic = producer.topic
        if stored_for is not None:
            stored = stored_for(producer)
        else:
            stored = [r for r in stored_topics[topic] if producer.owns(r.value)]
        stored, excused[producer.name_prefix] = excuse_dedup_off_copies(topic, stored, producer.reports,
                                                                        off_windows or [])
        committed = {p: o for (t, p), o in load.watcher.latest.items() if t == topic}
        backwards = [(p, a, b) for t, p, a, b in load.watcher.backwards if t == topic]
        verdicts.append(judge(producer, stored, received, committed, ends[topic], backwards))
    all_ends = {(t, p): end for t, e in ends.items() for p, end in e.items()}
    members = judge_members(load.members, load.watcher.latest, all_ends, load.watcher.backwards)
    return Outcome(verdicts, members, transactions, ends, excused)


def run_soak(work_dir: str, seconds: float, seed: int, clients: list[str] | None = None,
             say: Callable[[str], None] = print, broker_config: dict[str, str] | None = None,
             faults: list[str] | None = None) -> SoakResult:
    """One broker. broker_config: more broker settings (properties-file keys), e.g. a control run with
    deduplication off; faults: the kinds the schedule draws from (default every kind)."""
    clients = clients or list(PRODUCERS)
    dep = SingleBroker(work_dir, broker_config)
    try:
        wanted = faults or list(FAULTS)
        kinds = choose_kinds(dep.faults(), wanted, FAULTS)
        steps = plan(seed, seconds, kinds)
        say(f"soak seed={seed} seconds={seconds} clients={clients} work dir={work_dir}")
        say("\n".join(map(str, steps)) or "(no faults fit)")
        topics = stream_topics(clients)
        dep.create_topics([*topics.values(), TXN_TOPIC], PARTITIONS)
        dep.target.stream_topics = list(topics.values())
        load = standard_load(dep.bootstrap, clients, seed, seconds, log_dir=work_dir)
        outcome = drive(dep, load, steps, seconds, say, off_windows=dep.target.record.off_windows)
        controls = {**dep.controls(), "rebalances": sum(m.rebalances for m in outcome.members)}
        return SoakResult("single", seed, steps, outcome.verdicts, outcome.members, [outcome.transactions],
                          dep.skipped(wanted), controls, storage=dep.target.record, excused=outcome.excused)
    finally:
        dep.close()
