"""A real PostgreSQL server for tests: Debian's binaries, initdb/pg_ctl in a temporary directory, a free port.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user (which the Debian package
creates), otherwise as the current user. Trust authentication on 127.0.0.1 only: the server lives as long as one test
session and no one else can reach it. Each broker gets a database of its own (`create_database`).
"""
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

SUPERUSER = "kop"
SERVER_USER = "postgres"  # as root


def server_binaries() -> str | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


@dataclass
class PostgresServer:
    bin_dir: str
    port: int
    base: str = ""  # the temporary directory holding the cluster and its log

    @property
    def data(self) -> str:
        return os.path.join(self.base, "cluster")

    @property
    def log_path(self) -> str:
        return os.path.join(self.base, "postgres.log")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [os.path.join(self.bin_dir, args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=60)

    def init(self) -> "PostgresServer":
        self.base = tempfile.mkdtemp(prefix="kop-pg-")
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", self.data, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        return self

    def start(self) -> "PostgresServer":
        # fsync stays on: the crash tests rely on what PostgreSQL acknowledged being durable.
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='' -c max_connections=300"
        result = self._run("pg_ctl", "-D", self.data, "-l", self.log_path, "-o", options, "-w", "-t", "30", "start",
                           check=False)
        if result.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr}\n{self.log_tail()}")
        return self

    def stop(self, mode: str = "fast") -> None:
        """mode: smart, fast (disconnect clients, clean shutdown) or immediate (as a crash: recovery at start)."""
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop", check=False)

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, name)
        return self.url(name)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"
