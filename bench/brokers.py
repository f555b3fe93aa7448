"""Benchmark brokers: a fresh `kop standalone` process per run, in its own temporary directory, always stopped."""
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from integration.broker_process import BrokerProcess, free_port
from integration.postgres_server import PostgresServer, server_binaries

# librdkafka's own log lines (connection closed, retries) go through this logger instead of stderr.
RDKAFKA_LOG = logging.getLogger("bench.rdkafka")
RDKAFKA_LOG.setLevel(logging.ERROR)


@contextmanager
def running_broker(config: dict[str, str] | None = None, keep: bool = False, tree: str | None = None,
                   program: tuple[str, ...] | None = None) -> Iterator[BrokerProcess]:
    """Start a broker with `config` (properties-file keys, e.g. {"fsync": "false"}) on a free port; stop it and
    delete its data on exit unless keep. `tree`: run the kop of another source tree (a checkout of another commit);
    `program`: the command that stands for `kop` (a wrapper such as bench.traced_kop)."""
    root = tempfile.mkdtemp(prefix="kop-bench-")
    broker = BrokerProcess(f"{root}/data", config=dict(config or {}))
    if tree is not None:
        broker.program = tree_program(tree)
    if program is not None:
        broker.program = program
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def create_topic(bootstrap: str, name: str, partitions: int, timeout_s: float = 30.0,
                 client: dict[str, object] | None = None) -> None:
    """client: more librdkafka settings of the admin client."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG, **(client or {})})
    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=timeout_s).values():
        future.result(timeout_s)
    del admin  # closes its connections before the broker may be stopped


def tree_program(tree: str) -> tuple[str, ...]:
    """The command that runs `kop` from the source tree `tree` with this interpreter (and its installed packages)."""
    code = (f"import runpy, sys; sys.path.insert(0, {os.path.abspath(tree)!r}); sys.argv[0] = 'kop'; "
            "runpy.run_module('kop.cli', run_name='__main__')")
    return (sys.executable, "-c", code)


@contextmanager
def postgres_for_run() -> Iterator[PostgresServer]:
    """One PostgreSQL server from Debian's binaries for a whole benchmark run (a database per broker on it), stopped
    and removed on exit; exits with the reason where the binaries are not installed."""
    bin_dir = server_binaries()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries under /usr/lib/postgresql (`make postgres` installs them)")
    server = PostgresServer(bin_dir, free_port()).init().start()
    try:
        yield server
    finally:
        server.stop()
        server.remove()
