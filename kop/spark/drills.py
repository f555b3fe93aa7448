"""Failure drills for pipeline jobs, shared by `kop pipeline demo` and the tests: the driver killed -9 mid-job, and
kop killed -9 and restarted mid-job. Each returns how many offsets were stored when the kill landed, so the caller
can show the kill happened mid-job."""
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from kop.spark.ingest import IngestJob
from kop.spark.offsets import TopicOffsets
from kop.spark.options import OptionError

KILL_WAIT_S = 120.0
POLL_S = 0.05


class RestartableBroker(Protocol):
    bootstrap: str

    def kill(self) -> None: ...

    def start(self) -> object: ...


def end_offsets(bootstrap: str, topic: str) -> int:
    """The sum of the topic's end offsets (records plus holes); 0 while the topic does not exist."""
    planner = TopicOffsets({"bootstrap.servers": bootstrap})
    try:
        return sum(planner.latest([topic])[topic].values())
    except OptionError:
        return 0
    finally:
        planner.close()


def wait_for_first_records(bootstrap: str, topic: str) -> int:
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        stored = end_offsets(bootstrap, topic)
        if stored:
            return stored
        time.sleep(POLL_S)
    raise TimeoutError(f"no record reached {topic} within {KILL_WAIT_S:.0f}s")


def ingest_command(job: IngestJob, row_delay_ms: float) -> list[str]:
    """`kop pipeline ingest` for `job`, slowed down by `row_delay_ms` per row."""
    command = [sys.executable, "-m", "kop.cli", "pipeline", "ingest", "--bootstrap", job.bootstrap, "--job", job.name,
               "--topic", job.topic, "--partitions", str(job.partitions), "--row-delay-ms", str(row_delay_ms)]
    command += ["--admin-url", job.admin_url] if job.admin_url else []
    command += ["--key", job.key_field] if job.key_field else []
    command += [] if job.sequence_ids else ["--no-sequence-ids"]
    return command + job.inputs


def kill_driver_mid_ingest(job: IngestJob, row_delay_ms: float, log_path: str) -> int:
    """Run the ingest job as a driver process of its own and kill -9 it (its JVM and Python workers with it, as one
    process group) once its first records are stored."""
    with open(log_path, "wb") as log:
        driver = subprocess.Popen(ingest_command(job, row_delay_ms), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=os.getcwd())
    try:
        return wait_for_first_records(job.bootstrap, job.topic)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)


def kill_broker_mid_job(broker: RestartableBroker, topic: str, run_job: Callable[[], object], down_s: float) -> int:
    """Run the job while kop is killed -9 as soon as the job's first records are stored, and restarted `down_s`
    later; a job that ran out of task retries meanwhile is run again, as its user would."""
    stored_at_kill: list[int] = []

    def kill_and_restart() -> None:
        stored_at_kill.append(wait_for_first_records(broker.bootstrap, topic))
        broker.kill()
        time.sleep(down_s)
        broker.start()

    killer = threading.Thread(target=kill_and_restart, name="broker-killer")
    killer.start()
    try:
        run_job()
    except Exception:  # noqa: BLE001 -- Spark raises its own wrappers; any failure of the job means: run it again
        killer.join(KILL_WAIT_S + down_s + 60)
        run_job()
    killer.join(KILL_WAIT_S + down_s + 60)
    if not stored_at_kill:
        raise RuntimeError(f"kop was not killed: no record reached {topic}")
    return stored_at_kill[0]
