"""`kop pipeline demo`: ingest -> transform -> audit on generated orders, under injected failures, each run twice:
with sequence ids (the audit must find every record once) and without (the control: the same failures store
duplicates). The demo runs its own kop broker, since one drill kills it."""
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from kop.spark.audit import AuditReport, audit
from kop.spark.drills import kill_broker_mid_job, kill_driver_mid_ingest
from kop.spark.examples import enrich_and_aggregate, generate_orders
from kop.spark.faults import Faults
from kop.spark.ingest import IngestJob, run_ingest, source_records
from kop.spark.progress import spark_progress
from kop.spark.report import write_chart, write_json
from kop.spark.session import SparkSettings, spark_session
from kop.spark.transform import TransformJob, expected_outputs, run_transform

FAIL_AFTER_ROWS = 200
ROW_DELAY_MS = 2.0
BROKER_DOWN_S = 4.0
START_TIMEOUT_S = 30.0


class DemoBroker:
    """A `kop standalone` process on free ports that can be killed -9 and started again on the same ones."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.port, self.admin_port = _free_port(), _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> "DemoBroker":
        os.makedirs(self.data_dir, exist_ok=True)
        with open(os.path.join(os.path.dirname(self.data_dir), "kop.log"), "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kop.cli", "standalone", "--listen", self.bootstrap, "--data-dir",
                 self.data_dir, "--admin-port", str(self.admin_port)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"kop did not start on {self.bootstrap}; see {self.data_dir}/../kop.log")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Outcome:
    drill: str
    sequence_ids: bool
    report: AuditReport

    @property
    def as_expected(self) -> bool:
        """With sequence ids: exactly once. Without: nothing missing, and the failure stored duplicates."""
        if self.sequence_ids:
            return self.report.exactly_once
        return self.report.missing == 0 and self.report.duplicates > 0


def run_demo(work_dir: str, orders_per_file: int) -> bool:
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    console = Console()
    inputs = [os.path.join(work_dir, name) for name in ("orders-a.jsonl", "orders-b.jsonl")]
    for seed, path in enumerate(inputs):
        generate_orders(path, orders_per_file, seed)
    broker = DemoBroker(os.path.join(work_dir, "kop", "data")).start()
    spark = spark_session(SparkSettings(master="local[2,4]", app_name="kop-pipeline-demo", speculation=True))
    outcomes = []
    try:
        for sequence_ids in (True, False):
            for drill, run in DRILLS.items():
                console.rule(f"{drill} ({'sequence ids' if sequence_ids else 'control: no sequence ids'})")
                with spark_progress(spark, drill, console):
                    report = run(spark, broker, inputs, work_dir, sequence_ids)
                outcome = Outcome(drill, sequence_ids, report)
                _save(outcome, work_dir)
                outcomes.append(outcome)
    finally:
        spark.stop()
        broker.stop()
    console.print(_summary(outcomes))
    console.print(f"reports: {os.path.join(work_dir, 'reports')}")
    return all(outcome.as_expected for outcome in outcomes)


def _ingest_job(broker: DemoBroker, topic: str, inputs: list[str], sequence_ids: bool, **kwargs) -> IngestJob:
    return IngestJob(name=topic, inputs=inputs, topic=topic, bootstrap=broker.bootstrap, admin_url=broker.admin_url,
                     key_field="customer", sequence_ids=sequence_ids, **kwargs)


def _topic(drill: str, sequence_ids: bool) -> str:
    return f"{drill}-{'seq' if sequence_ids else 'control'}"


def _task_failures(spark, broker, inputs, work_dir, sequence_ids) -> AuditReport:
    """Every task's first attempt fails after writing part of its rows; speculative execution is on."""
    job = _ingest_job(broker, _topic("task-failures", sequence_ids), inputs, sequence_ids)
    run_ingest(spark, job, Faults(fail_after_rows=FAIL_AFTER_ROWS))
    return audit(spark, source_records(spark, job), job.bootstrap, job.topic)


def _driver_killed(spark, broker, inputs, work_dir, sequence_ids) -> AuditReport:
    """The driver is killed -9 once records are stored, then the job is run again."""
    job = _ingest_job(broker, _topic("driver-killed", sequence_ids), inputs, sequence_ids)
    kill_driver_mid_ingest(job, ROW_DELAY_MS, os.path.join(work_dir, f"{job.topic}-driver.log"))
    run_ingest(spark, job)
    return audit(spark, source_records(spark, job), job.bootstrap, job.topic)


def _broker_killed(spark, broker, inputs, work_dir, sequence_ids) -> AuditReport:
    """kop is killed -9 mid-ingest and restarted after the producers' message timeout: tasks fail and are retried."""
    job = _ingest_job(broker, _topic("kop-killed", sequence_ids), inputs, sequence_ids,
                      kafka_options={"message.timeout.ms": "2000", "reconnect.backoff.max.ms": "500"})
    kill_broker_mid_job(broker, job.topic, lambda: run_ingest(spark, job, Faults(row_delay_ms=ROW_DELAY_MS)),
                        BROKER_DOWN_S)
    return audit(spark, source_records(spark, job), job.bootstrap, job.topic)


def _transform(spark, broker, inputs, work_dir, sequence_ids) -> AuditReport:
    """The orders (ingested exactly once) -> enrich and aggregate -> totals, with task failures, then again from
    an old checkpoint and from none."""
    source = _ingest_job(broker, _topic("orders", sequence_ids), inputs[:1], True)
    run_ingest(spark, source)
    output = _topic("totals", sequence_ids)
    checkpoint = os.path.join(work_dir, "checkpoints", output)

    def job(checkpoint_dir: str) -> TransformJob:
        return TransformJob(name=output, input_topic=source.topic, output_topic=output, bootstrap=broker.bootstrap,
                            checkpoint=checkpoint_dir, function=enrich_and_aggregate, sequence_ids=sequence_ids)

    run_transform(spark, job(checkpoint))
    shutil.copytree(checkpoint, checkpoint + "-old")
    run_ingest(spark, _ingest_job(broker, source.topic, inputs[1:], True))
    run_transform(spark, job(checkpoint), Faults(fail_after_rows=FAIL_AFTER_ROWS))
    run_transform(spark, job(checkpoint + "-old"))
    run_transform(spark, job(checkpoint + "-none"))
    expected = expected_outputs(spark, output, source.topic, broker.bootstrap, enrich_and_aggregate)
    return audit(spark, expected, broker.bootstrap, output)


DRILLS: dict[str, Callable[..., AuditReport]] = {
    "task-failures": _task_failures,
    "driver-killed": _driver_killed,
    "kop-killed": _broker_killed,
    "transform-restarts": _transform,
}


def _save(outcome: Outcome, work_dir: str) -> None:
    folder = os.path.join(work_dir, "reports", _topic(outcome.drill, outcome.sequence_ids))
    os.makedirs(folder, exist_ok=True)
    write_json(outcome.report, os.path.join(folder, "audit.json"))
    write_chart(outcome.report, os.path.join(folder, "audit.png"),
                title=f"{outcome.drill}, {'sequence ids' if outcome.sequence_ids else 'no sequence ids (control)'}")


def _summary(outcomes: list[Outcome]) -> Table:
    table = Table(title="kop pipeline demo")
    for column in ("drill", "sequence ids", "expected", "stored", "duplicates", "missing", "holes", "as expected"):
        table.add_column(column)
    for o in outcomes:
        r = o.report
        table.add_row(o.drill, "on" if o.sequence_ids else "off (control)", str(r.expected), str(r.stored),
                      str(r.duplicates), str(r.missing), str(sum(p.holes for p in r.partitions)),
                      "yes" if o.as_expected else "NO")
    return table
