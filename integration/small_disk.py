"""A small filesystem of its own for a broker's data directory, and a filler file that makes it full on demand.

`small_disk(path)` mounts a tmpfs of a few MiB at `path` (root only: elsewhere, or where mounting is refused, the
test skips and says why) and always unmounts it afterwards. `Filler` takes all the free space but a given margin,
and gives it back when the fault is over, as an operator deleting files would.
"""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator

import pytest

CHUNK = 1024 * 1024


def mount_refused_reason(path: str, size_mb: int) -> str | None:
    """Mount a tmpfs of size_mb at path; None when mounted, else why not."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", path],
                          capture_output=True, text=True, timeout=30)
    if done.returncode:
        return f"mount -t tmpfs refused: {done.stderr.strip() or done.returncode}"
    return None


def unmount(path: str) -> None:
    done = subprocess.run(["umount", path], capture_output=True, timeout=30)
    if done.returncode:  # still busy (a process not yet reaped): detach it now, it goes when the last user does
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)


@contextlib.contextmanager
def small_disk(path: str, size_mb: int = 48) -> Iterator[str]:
    """A tmpfs of size_mb mounted at path for the duration; skips the test when it cannot be mounted."""
    reason = mount_refused_reason(path, size_mb)
    if reason is not None:
        pytest.skip(reason)
    try:
        yield path
    finally:
        unmount(path)


def free_bytes(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


class Filler:
    """A file that fills the filesystem at `path` up to a margin of free bytes."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "filler")

    def fill(self, leave_bytes: int = 0) -> None:
        """Write until the filesystem is full, then give back leave_bytes (rounded to whole pages)."""
        block = b"\0" * CHUNK
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(fd)
        if leave_bytes:
            size = os.path.getsize(self.path)
            os.truncate(self.path, max(0, size - leave_bytes))

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
