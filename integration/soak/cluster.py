"""Three brokers on one PostgreSQL database (kop/cluster), which the soak starts itself as the tests do (Debian's
binaries, initdb and pg_ctl in a temporary directory), each broker behind a fault proxy of its own that it
advertises. Partitions, group coordinators and transaction coordinators are spread over the brokers by hash; the
faults hit whoever holds them:

- `cut`: every third Produce response lost and its connection closed, on every broker's proxy;
- `kill_owner` / `pause_owner`: kill -9 (down for the duration, then started again) or SIGSTOP past the 3 s lease
  of the broker that leads the most soak partitions;
- `kill_group_coordinator`, `kill_txn_coordinator`, `pause_coordinator`: the same to the broker that coordinates the
  consumer group, or the transactional producer's id;
- `pg_restart`: PostgreSQL stopped as a crash (`pg_ctl stop -m immediate`, so it recovers at start) and started
  again after the duration: every lease and write waits on it.

Its controls: responses the proxies cut, how often each fault struck, and the brokers' log lines that show they
felt it (leases that ran out or could not be renewed, coordinator shards that moved)."""
from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable

from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from integration.broker_process import free_port
from integration.fault_proxy import CutPolicy
from integration.idem_raw import RawKafka, StoredRecord
from integration.pg_cluster import PgCluster
from integration.postgres_server import PostgresServer, server_binaries
from integration.soak.deployment import Deployment, Fault, count_lines
from integration.soak.producers import PRODUCERS
from integration.soak.run import (GROUP, PARTITIONS, TXN_TOPIC, SoakResult, choose_kinds, drive, standard_load,
                                  stream_topics)
from integration.soak.schedule import plan
from integration.soak.transactions import transactional_id
from integration.waiting import wait_for
from protocol.errors import ErrorCode

NODES = 3
GROUP_KEY, TRANSACTION_KEY = 0, 1
SERVED_S = 90  # for a partition to be served again after a fault
LOG_SIGNS = {"leases_ran_out": "the lease ran out", "lease_renewals_failed": "cannot renew the lease",
             "writes_failed": "write failed", "coordinators_moved": "moved to another broker"}


class Unavailable(Exception):
    """The deployment cannot run on this machine (the reason is the message)."""


class PgClusterDeployment(Deployment):
    def __init__(self, work_dir: str, group: str, transactional_id: str,
                 broker_config: dict[str, str] | None = None) -> None:
        bin_dir = server_binaries()
        if bin_dir is None:
            raise Unavailable("no PostgreSQL server binaries under /usr/lib/postgresql (`make postgres`)")
        self.group, self.transactional_id = group, transactional_id
        self.topics: list[str] = []
        self.struck: Counter[str] = Counter()
        self.pg = PostgresServer(bin_dir, free_port()).init().start()
        self.cluster = PgCluster(os.path.join(work_dir, "brokers"), self.pg.create_database("kop_soak"),
                                 cuts=CutPolicy(max_cuts=0))  # a proxy per broker, cutting only during `cut`
        try:
            self.cluster.start(NODES, broker_config)
        except BaseException:
            self.close()
            raise
        self.bootstrap = ",".join(proxy.bootstrap for proxy in self.cluster.proxies.values())

    # ---- reading, from the broker that serves each partition

    def _on_owner(self, topic: str, partition: int, read: Callable[[RawKafka], object]):
        """read(kafka) on a connection to the partition's broker, again while the partition moves under it."""
        def attempt():
            node = self.cluster.serving(topic, partition)
            if node is None:
                return None
            try:
                with RawKafka(self.cluster.port(node), timeout=60) as kafka:
                    return [read(kafka)]
            except (OSError, RuntimeError):
                return None
        return wait_for(attempt, f"a broker serving {topic}-{partition}", SERVED_S, interval=0.5)[0]

    def end_offsets(self, topic: str, partitions: range, committed: bool = False) -> dict[int, int]:
        return {p: self._on_owner(topic, p, lambda kafka: kafka.end_offsets(topic, [p], committed)[p])
                for p in partitions}

    def read(self, topic: str, partitions: range) -> list[StoredRecord]:
        return [r for p in partitions for r in self._on_owner(topic, p, lambda k: k.read_partition(topic, p))]

    def create_topics(self, topics: Iterable[str], partitions: int) -> None:
        with RawKafka(self.cluster.port(1)) as kafka:
            for topic in topics:
                assert kafka.create_topic(topic, partitions) == ErrorCode.NONE, topic
                self.topics.append(topic)
        for topic in self.topics:  # every broker agrees on the leaders, and they have their partitions open
            for p in range(partitions):
                self._on_owner(topic, p, lambda kafka: None)

    # ---- who to hit

    def busiest_owner(self) -> int:
        led: Counter[int] = Counter()
        for topic in self.topics:
            led.update(leader for leader in self.cluster.leaders(topic).values() if leader >= 0)
        return led.most_common(1)[0][0] if led else self.cluster.running()[0]

    def coordinator(self, key: str, key_type: int) -> int:
        """The broker coordinating `key` as a running broker names it (the busiest owner if none can say)."""
        for node in self.cluster.running():
            try:
                with RawKafka(self.cluster.port(node), timeout=5) as kafka:
                    answer = kafka.call(FindCoordinatorRequest[1](key=key, key_type=key_type),
                                        FindCoordinatorResponse, 1)
            except (OSError, RuntimeError):
                continue
            if answer.error_code == ErrorCode.NONE and answer.node_id in self.cluster.brokers:
                return answer.node_id
        return self.busiest_owner()

    # ---- the faults

    def faults(self) -> dict[str, Fault]:
        return {"cut": self.cut,
                "kill_owner": lambda d: self.kill(self.busiest_owner(), d, "kill_owner"),
                "kill_group_coordinator": lambda d: self.kill(self.coordinator(self.group, GROUP_KEY), d,
                                                              "kill_group_coordinator"),
                "kill_txn_coordinator": lambda d: self.kill(self.coordinator(self.transactional_id,
                                                                             TRANSACTION_KEY), d,
                                                            "kill_txn_coordinator"),
                "pause_owner": lambda d: self.pause(self.busiest_owner(), d, "pause_owner"),
                "pause_coordinator": lambda d: self.pause(self.coordinator(self.group, GROUP_KEY), d,
                                                          "pause_coordinator"),
                "pg_restart": self.pg_restart}

    def cut(self, duration: float) -> None:
        for proxy in self.cluster.proxies.values():
            proxy.set_policy(CutPolicy(every=3, max_cuts=1000))
        time.sleep(duration)
        for proxy in self.cluster.proxies.values():
            proxy.set_policy(None)
        self.struck["cut"] += 1

    def kill(self, node: int, duration: float, kind: str) -> None:
        self.cluster.brokers[node].kill()
        self.struck[kind] += 1
        time.sleep(duration)
        self.cluster.brokers[node].start(timeout=120)

    def pause(self, node: int, duration: float, kind: str) -> None:
        self.cluster.pause(node)
        self.struck[kind] += 1
        try:
            time.sleep(duration)
        finally:
            self.cluster.resume(node)

    def pg_restart(self, duration: float) -> None:
        self.pg.stop("immediate")  # as a crash: it recovers from its WAL at start
        self.struck["pg_restart"] += 1
        time.sleep(duration)
        self.pg.start()

    def controls(self) -> dict[str, int]:
        logs = [broker.log_path for broker in self.cluster.brokers.values()]
        return {"cuts": sum(proxy.stats().cuts for proxy in self.cluster.proxies.values()),
                **{f"struck_{kind}": n for kind, n in sorted(self.struck.items())},
                **{name: count_lines(logs, sign) for name, sign in LOG_SIGNS.items()},
                "pg_recoveries": count_lines([self.pg.log_path], "automatic recovery in progress")}

    def close(self) -> None:
        try:
            self.cluster.stop()
        finally:
            self.pg.stop()
            self.pg.remove()


def run_cluster_soak(work_dir: str, seconds: float, seed: int, clients: list[str] | None = None,
                     say: Callable[[str], None] = print, broker_config: dict[str, str] | None = None,
                     faults: list[str] | None = None) -> SoakResult:
    """The soak's clients, checker and verdicts of run.py against three brokers on PostgreSQL."""
    clients = clients or list(PRODUCERS)
    dep = PgClusterDeployment(work_dir, GROUP, transactional_id(TXN_TOPIC), broker_config)
    try:
        kinds = choose_kinds(dep.faults(), faults)
        steps = plan(seed, seconds, kinds)
        say(f"soak topology=cluster seed={seed} seconds={seconds} clients={clients} work dir={work_dir}")
        say("\n".join(map(str, steps)) or "(no faults fit)")
        dep.create_topics([*stream_topics(clients).values(), TXN_TOPIC], PARTITIONS)
        load = standard_load(dep.bootstrap, clients, seed, seconds, log_dir=work_dir)
        outcome = drive(dep, load, steps, seconds, say)
        controls = {**dep.controls(), "rebalances": sum(m.rebalances for m in outcome.members)}
        return SoakResult("cluster", seed, steps, outcome.verdicts, outcome.members, [outcome.transactions], [],
                          controls)
    finally:
        dep.close()
