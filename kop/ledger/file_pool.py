"""A bounded pool of open descriptors shared by every ledger file of a broker.

A broker with thousands of partitions would otherwise hold two descriptors per ledger file for ever, and run out of
them (a restart opens every ledger of every partition). A pooled file is opened on use and closed again when the pool
is full and it is the least recently used one, unless it is pinned: a write waiting for its fsync pins its file, so the
fsync runs on the descriptor the write went through and sees its errors.

Every method runs on the event loop's thread; a descriptor taken with `fd()` is for immediate use only (no await in
between), as the pool may close it on the next use of another file. A worker thread only ever uses a pinned one.
"""
import contextlib
import errno
import os
import resource
from collections import OrderedDict

DEFAULT_CAPACITY = 4096
MIN_CAPACITY = 16
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class PooledFile:
    __slots__ = ("path", "flags", "_pool", "_fd", "_pins", "_discarded")

    def __init__(self, pool: "FilePool", path: str, flags: int) -> None:
        self.path = path
        self.flags = flags
        self._pool = pool
        self._fd = -1
        self._pins = 0
        self._discarded = False

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    def fd(self) -> int:
        """The open descriptor, opening the file again if the pool closed it."""
        return self._pool.use(self)

    def pin(self) -> int:
        """The descriptor, kept open until a matching unpin."""
        fd = self.fd()
        self._pins += 1
        return fd

    def unpin(self) -> None:
        self._pins -= 1
        if self._pins == 0:
            if self._discarded:
                self._pool.forget(self)
            else:
                self._pool.shrink()  # pins may have held it over its capacity

    def close(self) -> None:
        """Close for good (the file is being deleted or its ledger closed); a pinned one closes on its last unpin."""
        self._discarded = True
        if self._pins == 0:
            self._pool.forget(self)


class FilePool:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a file pool needs room for at least one file")
        self.capacity = capacity
        self._open: OrderedDict[PooledFile, None] = OrderedDict()  # least recently used first
        self.opens = 0  # descriptors opened over the pool's life (a measure of churn)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def file(self, path: str, flags: int = os.O_RDWR) -> PooledFile:
        """A pooled handle on an existing file; nothing is opened until it is used."""
        return PooledFile(self, path, flags & ~(os.O_TRUNC | os.O_EXCL))  # reopened later: never emptied again

    def create(self, path: str) -> PooledFile:
        """Create (or empty) a file for reading and writing and pool it, open."""
        self._make_room()
        return self._track(self.file(path), self._open_fd(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC))

    def adopt(self, path: str, fd: int) -> PooledFile:
        """Pool a descriptor of `path` opened elsewhere (in a worker thread, or to recover the file first); the pool
        reopens the path for reading and writing once it has closed it."""
        self._make_room()
        self.opens += 1
        return self._track(self.file(path), fd)

    def _track(self, pooled: PooledFile, fd: int) -> PooledFile:
        pooled._fd = fd
        self._open[pooled] = None
        return pooled

    def use(self, pooled: PooledFile) -> int:
        if pooled._discarded:
            raise ValueError(f"{pooled.path}: used after close")
        if pooled._fd >= 0:
            self._open.move_to_end(pooled)
            return pooled._fd
        self._make_room()
        return self._track(pooled, self._open_fd(pooled.path, pooled.flags))._fd

    def forget(self, pooled: PooledFile) -> None:
        self._open.pop(pooled, None)
        if pooled._fd >= 0:
            _close_quietly(pooled._fd)
        pooled._fd = -1

    def shrink(self) -> None:
        """Close the least recently used unpinned files while more than the capacity are open."""
        if len(self._open) > self.capacity:
            self._evict(len(self._open) - self.capacity)

    def shed(self) -> int:
        """Close every file not pinned (the process ran out of descriptors elsewhere); returns how many."""
        return self._evict(len(self._open))

    def _open_fd(self, path: str, flags: int) -> int:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            # The process ran out of descriptors elsewhere (connections): give back what the pool may, try once more.
            if exc.errno not in OUT_OF_DESCRIPTORS or not self.shed():
                raise
            fd = os.open(path, flags, 0o644)
        self.opens += 1
        return fd

    def _make_room(self) -> None:
        excess = len(self._open) - self.capacity + 1
        if excess > 0:
            self._evict(excess)

    def _evict(self, count: int) -> int:
        """Close up to count unpinned files, least recently used first; returns how many were closed."""
        victims = []
        for pooled in self._open:
            if pooled._pins == 0:
                victims.append(pooled)
                if len(victims) == count:
                    break
        for pooled in victims:
            del self._open[pooled]
            _close_quietly(pooled._fd)
            pooled._fd = -1
        return len(victims)


def capacity_for_open_files_limit() -> int:
    """A quarter of the process's descriptors for ledger files (the rest are for connections and every partition's
    cursor log), at most DEFAULT_CAPACITY."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_CAPACITY
    return max(MIN_CAPACITY, min(DEFAULT_CAPACITY, soft // 4))


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):  # already gone with a failed disk: nothing more to do
        os.close(fd)


__all__ = ["DEFAULT_CAPACITY", "OUT_OF_DESCRIPTORS", "FilePool", "PooledFile", "capacity_for_open_files_limit"]
