"""Start and stop one `kop standalone` for a suite: free port, temp data dir, readiness by ApiVersions."""
from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from compat.paths import REPO_ROOT
from compat.system import free_port, pin_to
from protocol.errors import ErrorCode

HOST = "127.0.0.1"


def kop_source() -> Path:
    """The source tree whose kop is tested: this clone, or $KOP_COMPAT_KOP_SRC (e.g. an exported commit)."""
    return Path(os.environ.get("KOP_COMPAT_KOP_SRC", REPO_ROOT)).resolve()


def export_commit(revision: str, parent: Path) -> tuple[str, Path]:
    """`git archive` one commit of this clone into a fresh dir under `parent`: (short commit, dir).

    Tests a committed state while the shared working tree holds others' uncommitted edits.
    """
    commit = subprocess.run(["git", "rev-parse", "--short", f"{revision}^{{commit}}"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    target = Path(tempfile.mkdtemp(prefix=f"kop-{commit}-", dir=parent))
    archive = subprocess.Popen(["git", "archive", commit], cwd=REPO_ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return commit, target


def kop_revision() -> str:
    """Which kop a run tested: the clone's commit (marked when the tree has uncommitted changes), the
    commit `--kop-commit` exported ($KOP_COMPAT_KOP_COMMIT), or the $KOP_COMPAT_KOP_SRC tree."""
    if os.environ.get("KOP_COMPAT_KOP_COMMIT"):
        return (f"kop at commit `{os.environ['KOP_COMPAT_KOP_COMMIT']}` (exported with `git archive` by "
                "`--kop-commit`, so others' uncommitted edits in the working tree were not tested)")
    if kop_source() != REPO_ROOT.resolve():
        return f"kop from `{kop_source()}`"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "kop (not a git checkout)"
    return f"kop at commit `{commit}`" + (" with uncommitted changes" if dirty else "")


def kop_command() -> list[str]:
    """The console script beside this interpreter, else the module (before pyproject has it, or when
    $KOP_COMPAT_KOP_SRC names another tree: `-m` imports from the working directory first)."""
    script = Path(sys.executable).parent / "kop"
    if script.exists() and kop_source() == REPO_ROOT.resolve():
        return [str(script)]
    return [sys.executable, "-m", "kop.cli"]


def api_versions_ok(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when the broker answers an ApiVersions v0 request without an error.

    A bare TCP connect is not enough: a listener can accept before the broker serves requests.
    """
    client_id = b"kop-compat"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _read_exact(sock, 4)
            size = struct.unpack(">i", header)[0]
            payload = _read_exact(sock, size)
    except OSError:
        return False
    if len(payload) < 6:
        return False
    correlation_id, error_code = struct.unpack(">ih", payload[:6])
    return correlation_id == 1 and error_code == ErrorCode.NONE


def _read_exact(sock: socket.socket, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = sock.recv(count - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)


@dataclass
class KopBroker:
    """One broker process this gate started; `stop()` ends only that pid."""

    log_path: Path
    # Broker settings (Kafka spelling, written to a --config properties file): suites assume a cluster
    # configured their way, e.g. librdkafka's "default" scenario has num.partitions=4.
    properties: dict[str, str] = field(default_factory=dict)
    port: int = 0
    data_dir: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)
    restarts: int = 0
    cpus: frozenset[int] | None = None  # the CPUs the broker runs on (None: any)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, ready_timeout: float = 60.0) -> None:
        if self.port == 0:
            self.port = free_port(HOST)
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="kop-compat-data-"))
        command = [*kop_command(), "standalone", "--listen", self.bootstrap, "--data-dir", str(self.data_dir)]
        if self.properties:
            config = self.log_path.with_suffix(".properties")
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text("".join(f"{key}={value}\n" for key, value in self.properties.items()))
            command += ["--config", str(config)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"\n=== compat: starting {' '.join(command)}\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            command, cwd=kop_source(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=pin_to(self.cpus),
        )
        log.close()
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"kop exited with code {self.process.returncode} during startup; see {self.log_path}"
                )
            if api_versions_ok(HOST, self.port):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"kop did not answer ApiVersions within {ready_timeout:.0f}s; see {self.log_path}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart(self) -> None:
        """Bring the broker back on the same port and data dir (after it died under a test)."""
        self.stop(remove_data=False)
        self.restarts += 1
        self.start()

    def stop(self, remove_data: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self.process = None
        if remove_data and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> "KopBroker":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
