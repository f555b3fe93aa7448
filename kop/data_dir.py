"""The data directory and its lock: one broker per directory, as Kafka's `.lock` in each log dir.

Two brokers on one directory would each append to the same ledgers and overwrite each other's ledger lists, losing
acknowledged records. The first broker holds an exclusive flock(2) on `<data>/.lock` for as long as it runs and
writes its pid there; a second one is refused before it reads anything. The kernel drops the lock when the holder's
process ends, however it ends, so a broker killed with -9 never blocks its restart. flock(2) rather than fcntl's
record locks: a flock conflicts within one process too (two Broker objects in one test process).
"""
import fcntl
import os
import tempfile

from kop.startup import StartupError

LOCK_FILE = ".lock"


class DataDirLock:
    """Held from `acquire` until `release` (or the process's end)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: str) -> "DataDirLock":
        """Create the directory when its parent exists, lock it, check it is writable; StartupError otherwise."""
        path = os.path.abspath(data_dir)
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            problem = "is not a directory" if os.path.exists(parent) else "does not exist"
            raise StartupError(f"data directory {path}: its parent {parent} {problem}")
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StartupError(f"cannot create data directory {path}: {exc.strerror}") from None
        if not os.path.isdir(path):
            raise StartupError(f"data directory {path} is not a directory")
        lock_path = os.path.join(path, LOCK_FILE)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StartupError(f"data directory {path} is not writable: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StartupError(f"data directory {path} is in use by another kop (pid {holder}, lock file "
                               f"{lock_path}): one broker per data directory") from None
        lock = cls(path, fd)
        try:
            _check_writable(path)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            lock.release()
            raise
        return lock

    def release(self) -> None:
        # The file stays: removing it would let a broker that opened it just before lock a file no one else sees.
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else "unknown"


def _check_writable(path: str) -> None:
    """An existing lock file opens for writing even in a directory that is not writable: try to create a file."""
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise StartupError(f"data directory {path} is not writable: {exc.strerror}") from None
