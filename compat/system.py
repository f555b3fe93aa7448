"""Machine-level helpers: Debian packages the builds need, free TCP ports, an exclusive cache lock."""
from __future__ import annotations

import contextlib
import fcntl
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

_apt_updated = False


def _installed(package: str) -> bool:
    probe = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return probe.returncode == 0 and "install ok installed" in probe.stdout


def ensure_debian_packages(packages: list[str]) -> None:
    """apt-get install whichever of `packages` is missing (we run as root; `apt-get update` once first)."""
    global _apt_updated
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"missing Debian packages {missing} and no apt-get to install them")
    print(f"compat: installing Debian packages {' '.join(missing)}", flush=True)
    if not _apt_updated:
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
        _apt_updated = True
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        check=True,
        stdout=subprocess.DEVNULL,
        env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


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
