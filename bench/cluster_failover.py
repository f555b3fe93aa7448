"""Failover time of a cluster of brokers on one PostgreSQL database: kill -9 of the broker owning the most
partitions, then how long until the first write to one of its partitions is accepted by a survivor, and until every
one of its partitions is served again.

Three brokers on one database (a PostgreSQL server started for the run from Debian's binaries), one topic of N
partitions. The lease (`broker.session.timeout.ms`) and heartbeat are the run's: a failover is a lease running out,
then the survivors' next heartbeat, then opening the partitions (loading them from the database and rebuilding their
deduplication state); the last part is what grows with the partition count.

    python -m bench.cluster_failover --partitions 10 1000 --rounds 3
"""
import argparse
import tempfile
import time
from dataclasses import dataclass

from bench import machine
from bench.brokers import postgres_for_run
from bench.report import Table, fmt
from bench.stats import median
from integration.idem_raw import RawKafka, plain_batch
from integration.pg_cluster import LEASE, PgCluster, answering
from integration.waiting import wait_for
from protocol.errors import ErrorCode

BROKERS = 3
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Failover:
    partitions: int
    moved: int  # partitions the killed broker owned
    first_write_s: float  # kill -9 to the first write accepted on a new owner of one of them
    all_served_s: float  # kill -9 to every one of them served by a survivor


def served(cluster: PgCluster, topic: str, partitions: range) -> dict[int, int]:
    """partition -> the running broker serving it."""
    out = {}
    for node in cluster.running():
        for p in answering(cluster.port(node), topic, partitions):
            out[p] = node
    return out


def accepted_somewhere(cluster: PgCluster, topic: str, partition: int) -> bool:
    for node in cluster.running():
        with RawKafka(cluster.port(node)) as kafka:
            if kafka.produce(topic, partition, plain_batch([b"probe"])).error_code == ErrorCode.NONE:
                return True
    return False


def one_failover(url: str, partitions: int) -> Failover:
    topic = "failover"
    with tempfile.TemporaryDirectory(prefix="kop-bench-") as root:
        cluster = PgCluster(root, url)
        try:
            cluster.start(BROKERS)
            with RawKafka(cluster.port(1), timeout=120) as kafka:
                assert kafka.create_topic(topic, partitions) == ErrorCode.NONE
            everything = range(partitions)
            owners = wait_for(lambda: (found := served(cluster, topic, everything)) and len(found) == partitions
                              and found, "every partition served", timeout=300)
            victim = max(set(owners.values()), key=lambda node: sum(1 for o in owners.values() if o == node))
            moved = sorted(p for p, node in owners.items() if node == victim)
            cluster.brokers[victim].kill()
            killed = time.monotonic()
            while not accepted_somewhere(cluster, topic, moved[0]):
                time.sleep(POLL_S)
            first_write = time.monotonic() - killed
            while len(served(cluster, topic, moved)) < len(moved):
                time.sleep(POLL_S)
            return Failover(partitions, len(moved), first_write, time.monotonic() - killed)
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    print(machine.describe())
    results: dict[int, list[Failover]] = {n: [] for n in args.partitions}
    with postgres_for_run() as server:
        for r in range(args.rounds):
            for n in args.partitions:
                result = one_failover(server.create_database(f"failover_{r}_{n}"), n)
                results[n].append(result)
                print(f"  round {r + 1}/{args.rounds}, {n} partitions: {result.moved} moved, first write after "
                      f"{result.first_write_s:.2f} s, all served after {result.all_served_s:.2f} s")
    lease = f"lease {int(LEASE['broker.session.timeout.ms']) / 1000:g} s, heartbeat " \
            f"{int(LEASE['broker.heartbeat.interval.ms']) / 1000:g} s"
    t = Table(f"kill -9 of the broker owning the most partitions, {BROKERS} brokers, {lease}",
              ["partitions", "moved", "first write accepted (s)", "all moved partitions served (s)"])
    for n, runs in results.items():
        t.add(str(n), fmt(median([r.moved for r in runs])), fmt(median([r.first_write_s for r in runs]), 2),
              fmt(median([r.all_served_s for r in runs]), 2))
    t.notes.append(f"{args.rounds} rounds, medians")
    print(t.markdown() if args.markdown else t.text())
    if args.markdown:
        print("\n".join(f"\n_{note}_" for note in t.notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
