"""Two clusters that replicate to each other (kop/replication), `a` and `b`, each one `kop standalone --cluster-name`:
clients reach each broker through a fault proxy it advertises, and each cluster's replicators reach the other
through a link proxy of their own (the clusters registry names the proxy). Replication goes a -> b, and b -> a too
when two-way; the soak's producers write in a (and in b when two-way, to the same topics), the consumer group and
the transactional producer work in a, and the group's position is replicated (the namespace's
replicatedSubscriptions policy).

Faults: `link_down` (both link proxies close every connection and refuse new ones: the replicators' link is cut,
then restored), `link_lossy` (every second ReplicateEntries answer lost after the remote stored it: resends),
`cut` (clients' Produce responses, in both clusters), `kill_a` / `kill_b` (kill -9, down for the duration) and
`pause_a` / `pause_b` (SIGSTOP).

After the faults and the verdicts of run.py in a: every record acknowledged in one cluster is in the other exactly
once, in its partition, in its order, and no cluster holds a second copy of its own records (one come back); b reads
the committed transactions once and no aborted one; and the group fails over. Its position in b, watched all along,
is never ahead of what the group had committed in a (a failover at any moment would have lost nothing; how much it
would have repeated is reported), and reaches b's ends once the group has committed a's; then a is killed -9, new
records are produced in b, and members of every client in the same group in b receive them all and nothing the
group had consumed in a."""
from __future__ import annotations

import bisect
import functools
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from integration.broker_process import BrokerProcess
from integration.fault_proxy import CutPolicy, FaultProxy
from integration.geo import NAMESPACE, replicate
from integration.idem_raw import RawKafka, StoredRecord, read_topic
from integration.idem_stream import confluent_stream, stream_values
from integration.soak.consumers import MEMBERS, CommitWatcher, GroupMember, TopicPartition
from integration.soak.deployment import Deployment, Fault, count_lines
from integration.soak.producers import PRODUCERS, RATE_PER_S, StreamProducer
from integration.soak.run import (GROUP, PARTITIONS, TXN_TOPIC, SoakResult, choose_kinds, drive, standard_load,
                                  stream_topics)
from integration.soak.schedule import plan
from integration.soak.transactions import judge_transactions
from integration.waiting import wait_until
from kop.admin.client import AdminClient, cluster_resource, namespace_resource, topic_resource
from protocol.errors import ErrorCode
from protocol.replication import REPLICATE_ENTRIES_KEY

NAMES = ("a", "b")
REPLICATION_S = 180  # after the writers stop, for every replicator's backlog to empty
FAILOVER_S = 120  # for the group's position to reach b, and for its members there to consume what b has
AFTER_FAILOVER = 50  # records per topic produced in b once a is down
LOG_SIGNS = {"replicators_recovered": "replicating again", "snapshots_timed_out": "timed out waiting for",
             "groups_moved_by_updates": "by an update from"}


@dataclass
class Side:
    """One cluster: its broker, the proxy its clients use, the proxy the other cluster's replicators use."""

    name: str
    broker: BrokerProcess
    proxy: FaultProxy
    link: FaultProxy

    def end_offsets(self, topic: str, partitions: range, committed: bool = False) -> dict[int, int]:
        with RawKafka(self.broker.port, timeout=60) as kafka:
            return kafka.end_offsets(topic, partitions, committed)

    def read(self, topic: str, partitions: range) -> list[StoredRecord]:
        return read_topic(self.broker.port, topic, partitions)

    def backlog(self, topics: Iterable[str]) -> int | None:
        """Entries its replicators have not had answered yet, over `topics` (None: it cannot say now)."""
        admin = AdminClient(self.broker.admin_url, timeout=10)
        try:
            return sum(remote["replicationBacklog"] for t in topics
                       for remote in admin.get(topic_resource(t, "stats"))["replication"].values())
        except Exception:  # noqa: BLE001 - restarting, or the stats not there yet: asked again
            return None


class GeoDeployment(Deployment):
    """The Deployment interface is cluster a's (where the clients of run.py work); `sides` has both."""

    def __init__(self, work_dir: str, two_way: bool, broker_config: dict[str, str] | None = None) -> None:
        self.two_way = two_way
        self.sides: dict[str, Side] = {}
        self.struck: Counter[str] = Counter()
        try:
            for name in NAMES:
                proxy, link = FaultProxy().start(), FaultProxy().start()
                broker = BrokerProcess(os.path.join(work_dir, f"data-{name}"), admin_port=0,
                                       options=("--cluster-name", name),
                                       config={**(broker_config or {}), "advertised.port": str(proxy.port)})
                self.sides[name] = Side(name, broker, proxy, link)
                broker.start()
                proxy.upstream_port = link.upstream_port = broker.port
            for side in self.sides.values():
                admin = AdminClient(side.broker.admin_url)
                for other in self.sides.values():
                    admin.put(cluster_resource(other.name), {"brokerServiceUrl": other.link.bootstrap,
                                                             "serviceUrl": other.broker.admin_url})
                admin.post(namespace_resource(NAMESPACE, "replicatedSubscriptions"), True)
            for name in (NAMES if two_way else NAMES[:1]):
                replicate(self.sides[name].broker, list(NAMES))
        except BaseException:
            self.close()
            raise
        self.a, self.b = self.sides["a"], self.sides["b"]
        self.bootstrap = self.a.proxy.bootstrap

    def create_topics(self, topics: Iterable[str], partitions: int) -> None:
        for side in self.sides.values():  # in both, so that b can be read before the first record arrives
            with RawKafka(side.broker.port) as kafka:
                for topic in topics:
                    assert kafka.create_topic(topic, partitions) == ErrorCode.NONE, (side.name, topic)

    def end_offsets(self, topic: str, partitions: range, committed: bool = False) -> dict[int, int]:
        return self.a.end_offsets(topic, partitions, committed)

    def read(self, topic: str, partitions: range) -> list[StoredRecord]:
        return self.a.read(topic, partitions)

    def settle(self, topics: list[str]) -> None:
        """Until every replicator of `topics`, both ways, has had every entry answered (bounded: what is still
        missing then shows in the verdicts)."""
        wait_until(lambda: all(side.backlog(topics) == 0 for side in self.sides.values()), REPLICATION_S, 1.0)

    # ---- the faults

    def faults(self) -> dict[str, Fault]:
        faults: dict[str, Fault] = {"link_down": self.link_down, "link_lossy": self.link_lossy, "cut": self.cut}
        for name in NAMES:
            faults[f"kill_{name}"] = functools.partial(self.kill, name)
            faults[f"pause_{name}"] = functools.partial(self.pause, name)
        return faults

    def link_down(self, duration: float) -> None:
        for side in self.sides.values():
            side.link.sever(True)
        self.struck["link_down"] += 1
        time.sleep(duration)
        for side in self.sides.values():
            side.link.sever(False)

    def link_lossy(self, duration: float) -> None:
        self._policies("link", CutPolicy(every=2, max_cuts=1000, apis=frozenset({REPLICATE_ENTRIES_KEY})), duration,
                       "link_lossy")

    def cut(self, duration: float) -> None:
        self._policies("proxy", CutPolicy(every=3, max_cuts=1000), duration, "cut")

    def _policies(self, which: str, policy: CutPolicy, duration: float, kind: str) -> None:
        proxies = [getattr(side, which) for side in self.sides.values()]
        for proxy in proxies:
            proxy.set_policy(policy)
        self.struck[kind] += 1
        time.sleep(duration)
        for proxy in proxies:
            proxy.set_policy(None)

    def kill(self, name: str, duration: float) -> None:
        broker = self.sides[name].broker
        broker.kill()
        self.struck[f"kill_{name}"] += 1
        time.sleep(duration)
        broker.start(timeout=120)

    def pause(self, name: str, duration: float) -> None:
        pid = self.sides[name].broker.proc.pid
        os.kill(pid, signal.SIGSTOP)
        self.struck[f"pause_{name}"] += 1
        try:
            time.sleep(duration)
        finally:
            os.kill(pid, signal.SIGCONT)

    def controls(self) -> dict[str, int]:
        links = [side.link.stats() for side in self.sides.values()]
        logs = [side.broker.log_path for side in self.sides.values()]
        return {"client_cuts": sum(side.proxy.stats().cuts for side in self.sides.values()),
                "link_connections_severed": sum(s.severed for s in links),
                "link_answers_lost": sum(s.cuts_by_api.get(REPLICATE_ENTRIES_KEY, 0) for s in links),
                **{f"struck_{kind}": n for kind, n in sorted(self.struck.items())},
                **{name: count_lines(logs, sign) for name, sign in LOG_SIGNS.items()}}

    def close(self) -> None:
        for side in self.sides.values():
            side.broker.stop()
            side.proxy.stop()
            side.link.stop()


# ---- the verdicts

@dataclass(frozen=True, slots=True)
class ReplicaVerdict:
    """One producer's records in the other cluster."""

    name: str  # the producer's
    where: str  # the cluster that holds the copies
    acked: int
    present: int
    lost: int  # acknowledged at the source, not in the remote
    duplicated: int  # extra copies in the remote
    out_of_order: int  # adjacent pairs, per partition, in another order than at the source
    misplaced: int  # in another partition than at the source
    looped: int  # extra copies of the producer's own records at its source (come back from the remote)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.out_of_order or self.misplaced or self.looped)

    def summary(self) -> str:
        return (f"{self.name + '@' + self.where:<19} {'ok  ' if self.ok else 'FAIL'} replica: acked={self.acked} "
                f"present={self.present} lost={self.lost} duplicated={self.duplicated} "
                f"out_of_order={self.out_of_order} misplaced={self.misplaced} looped={self.looped}")


def judge_replica(producer: StreamProducer, where: str, at_source: list[StoredRecord],
                  at_remote: list[StoredRecord]) -> ReplicaVerdict:
    source = {r.value: r for r in at_source if producer.owns(r.value)}
    copies = [r for r in at_remote if producer.owns(r.value)]
    counts = Counter(r.value for r in copies)
    by_partition: dict[int, list[StoredRecord]] = defaultdict(list)
    for record in copies:
        by_partition[record.partition].append(record)
    out_of_order = 0
    for records in by_partition.values():
        order = [source[r.value].offset if r.value in source else -1 for r in sorted(records, key=lambda r: r.offset)]
        out_of_order += sum(1 for x, y in zip(order, order[1:]) if y <= x)
    acked = [r.value for r in producer.reports if r.error is None]
    return ReplicaVerdict(
        producer.name_prefix, where, len(acked), len(counts), sum(1 for v in acked if v not in counts),
        sum(n - 1 for n in counts.values()), out_of_order,
        sum(1 for r in copies if r.value in source and source[r.value].partition != r.partition),
        sum(n - 1 for n in Counter(r.value for r in at_source if producer.owns(r.value)).values()))


@dataclass(frozen=True, slots=True)
class FailoverVerdict:
    reached: bool  # the group's position in b reached b's ends once the group had committed a's
    positions: int  # control: the group's offsets in b summed at the failover (0: b never knew the group)
    ahead: list[tuple[TopicPartition, int, int]]  # b's position, past a record the group had not committed in a
    max_repeat: int  # the most records a failover at a watched moment would have delivered again
    skipped: int  # records before b's position at the failover that the group had not committed in a
    unconsumed: int  # records at or after it that the members in b did not receive
    duplicates: int  # records the members in b received that the group had committed in a
    produced_after: int  # control: records acknowledged in b after a was killed
    member_errors: list[str]

    @property
    def ok(self) -> bool:
        return (self.reached and self.positions > 0 and not (self.ahead or self.skipped or self.unconsumed
                                                             or self.duplicates or self.member_errors))

    def summary(self) -> str:
        return (f"{'group failover':<19} {'ok  ' if self.ok else 'FAIL'} reached={self.reached} "
                f"positions={self.positions} ahead={self.ahead[:5]} max_repeat={self.max_repeat} "
                f"skipped={self.skipped} unconsumed={self.unconsumed} duplicates={self.duplicates} "
                f"produced_after={self.produced_after}" + (f" errors={self.member_errors}" if self.member_errors
                                                          else ""))


def positions_ahead(history_b: list[tuple[float, dict[TopicPartition, int]]],
                    history_a: list[tuple[float, dict[TopicPartition, int]]],
                    stored_a: dict[TopicPartition, list[StoredRecord]],
                    stored_b: dict[TopicPartition, list[StoredRecord]]
                    ) -> tuple[list[tuple[TopicPartition, int, int]], int]:
    """Each position of the group that b answered, against the first of the group's committed offsets that a
    answered no earlier (so at least what a held when the update that set it was written): (partition, b's
    position, a's committed offset) where b's position is past a record that a's offset had not passed; and the
    most records, summed over the partitions, that a failover at one of those moments would have delivered again
    (a's committed records past b's position)."""
    in_a = {tp: {r.value: r.offset for r in records} for tp, records in stored_a.items()}
    a_offsets = {tp: [r.offset for r in records] for tp, records in stored_a.items()}
    b_offsets, covers = {}, {}  # per partition: b's offsets, and the highest a offset among b's first k records
    for tp, records in stored_b.items():
        b_offsets[tp] = [r.offset for r in records]
        highest, prefix = -1, [-1]
        for r in records:
            highest = max(highest, in_a.get(tp, {}).get(r.value, 1 << 62))
            prefix.append(highest)
        covers[tp] = prefix
    ahead, max_repeat, i = [], 0, 0
    final_a = history_a[-1][1] if history_a else {}
    for answered, positions in history_b:
        while i < len(history_a) and history_a[i][0] < answered:
            i += 1
        committed = history_a[i][1] if i < len(history_a) else final_a
        repeat = 0
        for tp, position in positions.items():
            k = bisect.bisect_left(b_offsets.get(tp, []), position)
            limit = committed.get(tp, 0)
            if covers.get(tp, [-1])[k] >= limit:
                ahead.append((tp, position, limit))
            else:
                repeat += max(0, bisect.bisect_left(a_offsets.get(tp, []), limit) - k)
        max_repeat = max(max_repeat, repeat)
    return ahead, max_repeat


def fail_over(dep: GeoDeployment, clients: list[str], topics: list[str], watcher_a: CommitWatcher,
              watcher_b: CommitWatcher, say: Callable[[str], None]) -> FailoverVerdict:
    """The group's position in b once it committed a's ends; a killed -9; new records in b; the group there."""
    partitions = range(PARTITIONS)
    ends_b = {(t, p): end for t in topics for p, end in dep.b.end_offsets(t, partitions).items()}
    reached = wait_until(lambda: all(watcher_b.latest.get(tp, -1) >= end for tp, end in ends_b.items()),
                         FAILOVER_S, 0.5)
    position = {tp: watcher_b.latest.get(tp, 0) for tp in ends_b}
    stored_a = _by_partition(dep.a, topics)
    say(f"failing over: the group's position in b {'reached' if reached else 'did NOT reach'} b's ends; "
        f"kill -9 of a")
    failed_over = time.monotonic()  # b's positions from here on are the members' own there
    dep.a.broker.kill()
    produced = [r for t in topics for r in confluent_stream(dep.b.proxy.bootstrap, t,
                                                             stream_values(f"after-{t}", AFTER_FAILOVER),
                                                             idempotent=True, compression="none")]
    ends_after = {(t, p): end for t in topics for p, end in dep.b.end_offsets(t, partitions).items()}
    members = [MEMBERS[c](dep.b.proxy.bootstrap, GROUP, topics, f"{c}-in-b", FAILOVER_S + 60)
               for c in clients if c in MEMBERS]
    for member in members:
        member.start()
    try:
        wait_until(lambda: all(watcher_b.latest.get(tp, -1) >= end for tp, end in ends_after.items()),
                   FAILOVER_S, 0.5)
    finally:
        for member in members:
            member.stop()
        for member in members:
            member.join(60)
    stored_b = _by_partition(dep.b, topics)
    committed_a = {r.value for tp, records in stored_a.items() for r in records
                   if r.offset < watcher_a.latest.get(tp, 0)}
    received_b = set().union(*(m.received for m in members))
    ahead, max_repeat = positions_ahead([h for h in watcher_b.history if h[0] < failed_over], watcher_a.history,
                                        stored_a, stored_b)
    return FailoverVerdict(
        reached, sum(position.values()), ahead, max_repeat,
        skipped=sum(1 for tp, records in stored_b.items() for r in records
                    if r.offset < position[tp] and r.value not in committed_a),
        unconsumed=sum(1 for tp, records in stored_b.items() for r in records
                       if r.offset >= position[tp] and r.value not in received_b),
        duplicates=len(received_b & committed_a),
        produced_after=sum(1 for r in produced if r.error is None),
        member_errors=[f"{m.member}: {m.error!r}" for m in members if m.error is not None])


def _by_partition(side: Side, topics: list[str]) -> dict[TopicPartition, list[StoredRecord]]:
    out: dict[TopicPartition, list[StoredRecord]] = {}
    for topic in topics:
        for record in side.read(topic, range(PARTITIONS)):
            out.setdefault((topic, record.partition), []).append(record)
    return out


def run_geo_soak(work_dir: str, seconds: float, seed: int, clients: list[str] | None = None,
                 say: Callable[[str], None] = print, broker_config: dict[str, str] | None = None,
                 faults: list[str] | None = None, two_way: bool = False) -> SoakResult:
    clients = clients or list(PRODUCERS)
    dep = GeoDeployment(work_dir, two_way, broker_config)
    watcher_b = None
    try:
        kinds = choose_kinds(dep.faults(), faults)
        steps = plan(seed, seconds, kinds)
        say(f"soak topology=geo{' two-way' if two_way else ''} seed={seed} seconds={seconds} clients={clients} "
            f"work dir={work_dir}")
        say("\n".join(map(str, steps)) or "(no faults fit)")
        topics = stream_topics(clients)
        dep.create_topics([*topics.values(), TXN_TOPIC], PARTITIONS)
        rate = RATE_PER_S / 2 if two_way else RATE_PER_S  # the same load in all as one-way
        load = standard_load(dep.bootstrap, clients, seed, seconds, rate, log_dir=work_dir)
        source: dict[StreamProducer, Side] = {}
        for producer in load.producers:
            producer.name_prefix = f"{producer.client}.a"
            source[producer] = dep.a
        if two_way:
            for client in clients:
                producer = PRODUCERS[client](dep.b.proxy.bootstrap, topics[client], name=f"{client}.b", rate=rate)
                load.producers.append(producer)
                source[producer] = dep.b
        watcher_b = CommitWatcher(dep.b.proxy.bootstrap, GROUP, [(t, p) for t in topics.values()
                                                                 for p in range(PARTITIONS)])
        watcher_b.start()
        every_topic = [*topics.values(), TXN_TOPIC]
        stored: dict[tuple[str, str], list[StoredRecord]] = {}

        def stored_in(side: Side, topic: str) -> list[StoredRecord]:
            if (side.name, topic) not in stored:
                stored[(side.name, topic)] = side.read(topic, range(PARTITIONS))
            return stored[(side.name, topic)]

        outcome = drive(dep, load, steps, seconds, say,
                        stored_for=lambda p: [r for r in stored_in(source[p], p.topic) if p.owns(r.value)],
                        settle=lambda: dep.settle(every_topic))
        replicas = [judge_replica(p, other.name, stored_in(source[p], p.topic), stored_in(other, p.topic))
                    for p in load.producers for other in dep.sides.values() if other is not source[p]]
        in_b = judge_transactions(load.txn, dep.b.end_offsets, dep.b.proxy.bootstrap, where="@b", replica=True)
        failover = fail_over(dep, clients, list(topics.values()), load.watcher, watcher_b, say)
        controls = {**dep.controls(), "rebalances": sum(m.rebalances for m in outcome.members)}
        return SoakResult("geo two-way" if two_way else "geo", seed, steps, outcome.verdicts, outcome.members,
                          [outcome.transactions, in_b], [], controls, checks=[*replicas, failover])
    finally:
        if watcher_b is not None:
            watcher_b.stop()
            watcher_b.join(30)
        dep.close()
