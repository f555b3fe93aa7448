"""A one-line description of the machine and software a benchmark ran on, for BENCHMARKS.md."""
import datetime
import os
import platform
import subprocess


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def describe() -> str:
    try:
        import confluent_kafka
        librdkafka = confluent_kafka.libversion()[0]
    except ImportError:
        librdkafka = "n/a"
    return (f"{os.cpu_count()} cores ({cpu_model()}), Linux {platform.release()}, "
            f"Python {platform.python_version()}, librdkafka {librdkafka}")


def today() -> str:
    return datetime.date.today().isoformat()


def source_tree(repo: str) -> str:
    """The commit benchmarked, and whether the working tree had uncommitted changes to tracked files."""
    try:
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"
    return f"commit {commit or 'unknown'}{' + uncommitted changes' if dirty else ''}"
