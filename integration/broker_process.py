"""Start and stop real `kop standalone` processes for integration tests."""
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KOP_SCRIPT = os.path.join(os.path.dirname(sys.executable), "kop")  # installed next to the interpreter, as pip puts it


# The storage engine of the brokers tests start: None keeps each broker's ledgers in its data directory; otherwise a
# function that creates an empty PostgreSQL database and returns its URL (set by `pytest --storage postgresql`, see
# integration/postgres_fixture.py). A data directory keeps its database across restarts, as it keeps its files.
new_postgres_database: Callable[[], str] | None = None
_databases: dict[str, str] = {}
# Settings every broker on PostgreSQL gets unless its test sets them (`pytest --pg-setting KEY=VALUE`), e.g. a small
# managed.ledger.cache.bytes to run the suite with reads that miss the entry cache.
postgres_settings: dict[str, str] = {}


def storage_options(data_dir: str) -> list[str]:
    """The `--storage` option for a broker of this data directory under the session's engine."""
    if new_postgres_database is None:
        return []
    key = os.path.abspath(data_dir)
    if key not in _databases:
        _databases[key] = new_postgres_database()
    return ["--storage", _databases[key]]


_handed_out: set[int] = set()

# Ports come from below the kernel's ephemeral range (32768 and up on Linux), so no client's outgoing connection holds
# one, and each pytest-xdist worker has a slice of its own, so two workers never pick the same port.
PORTS_FIRST, PORTS_LAST = 10000, 32767


def _port_slice() -> range:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % workers if worker.isdigit() else 0
    size = (PORTS_LAST - PORTS_FIRST) // workers
    return range(PORTS_FIRST + index * size, PORTS_FIRST + (index + 1) * size)


def free_port() -> int:
    """A port free now and never handed out before by this process, from this worker's slice (a broker told to
    listen twice on one port refuses to start)."""
    ports = _port_slice()
    start = random.randrange(len(ports))
    for step in range(len(ports)):
        port = ports[(start + step) % len(ports)]
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port left in {ports}")


@dataclass
class BrokerProcess:
    data_dir: str
    port: int = 0
    config: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log_path: str = ""
    admin_port: int | None = None  # None: no admin API; 0: on a free port picked at the first start (then kept)
    program: tuple[str, ...] = (sys.executable, "-m", "kop.cli")  # or the `kop` console script
    options: tuple[str, ...] = ()  # more `kop standalone` options, e.g. ("--log-format", "json")
    env: dict[str, str] = field(default_factory=dict)  # added to the process's environment (e.g. a fake clock)
    cwd: str = REPO  # where it runs: `-m kop.cli` imports kop from here (another tree's, to compare commits)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        if not self.admin_port:
            raise RuntimeError("this broker was started without the admin API (admin_port=None)")
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 60.0, wait: bool = True) -> "BrokerProcess":
        """Start the broker and wait until it serves Kafka clients (wait=False: return once the process runs). The
        bound is generous: on a loaded machine a start on PostgreSQL (its coordinator shards) took over 30 s."""
        if not self.port:
            self.port = free_port()
        os.makedirs(self.data_dir, exist_ok=True)
        if self.admin_port == 0:
            self.admin_port = free_port()
        args = [*self.program, "standalone", "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", self.data_dir, "--admin-port", str(self.admin_port or 0), *self.options]
        if "--storage" not in self.options:
            args += storage_options(self.data_dir)
        config = {**postgres_settings, **self.config} if "--storage" in args else self.config
        if config:
            path = os.path.join(self.data_dir, "..", f"kop-{self.port}.properties")
            with open(path, "w") as f:
                f.writelines(f"{k}={v}\n" for k, v in config.items())
            args += ["--config", path]
        self.log_path = os.path.join(os.path.dirname(os.path.abspath(self.data_dir)), f"kop-{self.port}.log")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env} if self.env else None)
        log.close()
        if not wait:
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kop exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self  # the admin API listens before the Kafka port does
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"kop did not listen on {self.port} within {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait (a graceful shutdown)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def kill(self) -> None:
        """kill -9: no chance to flush or clean up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, hard: bool = False) -> "BrokerProcess":
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return "(no log)"
