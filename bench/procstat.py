"""What a process has used, read from /proc and the file system (Linux only)."""
import os

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all threads included (/proc/<pid>/stat utime, stime)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces; the fields after its closing parenthesis are fixed.
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS  # fields 14 and 15 of the whole line


def _schedstat_ns(pid: int, field: int) -> int:
    """A field of /proc/<pid>/task/*/schedstat summed over the process's threads (0: on a core, 1: waiting for one),
    in ns. Threads that already exited are not counted."""
    total_ns = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total_ns += int(f.read().split()[field])
        except (OSError, ValueError, IndexError):
            pass  # the thread exited while we listed
    return total_ns


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process: the sum of its threads' scheduler run time (/proc/<pid>/task/*/schedstat, in ns),
    which resolves a 10 ms tick a hundred thousand times finer than utime + stime. Threads that already exited are
    not counted (kop's fsync pool keeps its threads); without schedstat, falls back to utime + stime."""
    total_ns = _schedstat_ns(pid, 0)
    if total_ns:
        return total_ns / 1e9
    user, system = cpu_times(pid)
    return user + system


def run_queue_seconds(pid: int) -> float:
    """Seconds a process's threads spent runnable but waiting for a core: on a loaded machine, the time it was held
    back by other work rather than by its own."""
    return _schedstat_ns(pid, 1) / 1e9


def directory_bytes(path: str) -> int:
    """Apparent size of every file under path."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass  # a file deleted while we walk (ledger rolled, retention)
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (/proc/<pid>/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def open_descriptors(pid: int) -> int:
    """Descriptors a process holds open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))
