"""Machine-level helpers: Debian packages the builds need, free TCP ports, an exclusive cache lock, CPU affinity."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

_apt_updated = False


def _present(probe: str) -> bool:
    """A probe is a command name (looked up on PATH) or an absolute file path."""
    return Path(probe).exists() if probe.startswith("/") else shutil.which(probe) is not None


def ensure_debian_packages(requirements: dict[str, str]) -> None:
    """Install the Debian package of every probe (command or file) that is missing.

    Probing for the thing itself rather than asking dpkg keeps a tool installed some other way (npm
    bundled with a Node.js install, say) from pulling in the Debian package. We run as root; `apt-get
    update` runs once first.
    """
    global _apt_updated
    missing = sorted({package for probe, package in requirements.items() if not _present(probe)})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"missing Debian packages {missing} and no apt-get to install them")
    print(f"compat: installing Debian packages {' '.join(missing)}", flush=True)
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if not _apt_updated:
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL, env=env)
        _apt_updated = True
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                   check=True, stdout=subprocess.DEVNULL, env=env)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the usual bind-to-0 trick; the race is acceptable here)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Serialise builds of one cache entry between concurrent runs (a developer and CI on one machine)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def separate_cpus() -> tuple[frozenset[int], frozenset[int]] | None:
    """Two disjoint sets of the CPUs this process may use (the first CPU, the rest), or None on one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return (frozenset(cpus[:1]), frozenset(cpus[1:])) if len(cpus) > 1 else None


def pin_to(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A Popen preexec_fn that keeps the child (and its threads) on `cpus`; None: anywhere."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
