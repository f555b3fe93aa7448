"""The PySpark pipeline against a real broker, each failure injection with its control: with sequence ids the audit
finds every record once; the same run without them stores duplicates, which shows the failure happened and mattered.

The tests marked 'needs per-record deduplication' assert what kop's deduplication by sequence-id headers gives; the
controls and everything else hold without it."""
import csv
import json
import os
import shutil
import threading

import pytest
from pyspark.sql import functions as F

from integration.txn_clients import ck_open_transaction
from kop.spark.audit import audit, read_topic
from kop.spark.drills import end_offsets, kill_broker_mid_job, kill_driver_mid_ingest
from kop.spark.examples import enrich_and_aggregate, generate_orders
from kop.spark.faults import Faults
from kop.spark.ingest import IngestJob, run_ingest, source_records
from kop.spark.report import write_chart, write_json
from kop.spark.sequencing import PRODUCER_NAME, SEQUENCE_ID
from kop.spark.topics import ensure_topic
from kop.spark.transform import TransformJob, expected_outputs, run_transform

pytestmark = pytest.mark.slow  # Spark in local mode: minutes; make test-slow runs it

ORDERS_PER_FILE = 150
FAIL_AFTER_ROWS = 50  # each task's first attempt dies after handing this many rows to the sink
ROW_DELAY_MS = 15.0  # slows a job to seconds, so a driver or broker can be killed while it runs


@pytest.fixture(scope="module")
def orders(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("orders")
    paths = [str(folder / "orders-a.jsonl"), str(folder / "orders-b.jsonl")]
    for seed, path in enumerate(paths):
        generate_orders(path, ORDERS_PER_FILE, seed)
    return paths


def ingest_job(broker, topic: str, inputs: list[str], sequence_ids: bool = True, **kwargs) -> IngestJob:
    return IngestJob(name=topic, inputs=inputs, topic=topic, bootstrap=broker.bootstrap, admin_url=broker.admin_url,
                     key_field="customer", partitions=2, sequence_ids=sequence_ids, **kwargs)


def audit_ingest(spark, job: IngestJob):
    return audit(spark, source_records(spark, job), job.bootstrap, job.topic)


def ids(sequence_ids: bool) -> str:
    return "with-sequence-ids" if sequence_ids else "control-without-sequence-ids"


def check(report, sequence_ids: bool) -> None:
    """With sequence ids: every record once, and the injected failure did re-send records (kop dropped them, leaving
    holes). Without: the same failure stored duplicates and nothing is missing."""
    assert report.missing == 0
    if sequence_ids:
        assert report.duplicates == 0
        assert report.exactly_once
        assert sum(p.holes for p in report.partitions) > 0, "the failure re-sent nothing: it did not happen"
    else:
        assert report.duplicates > 0


# ---- ingest


def test_ingest_writes_every_record_with_its_name_and_file_position(spark, spark_broker, orders):
    job = ingest_job(spark_broker, "ingest-plain", orders)
    assert run_ingest(spark, job).written == 2 * ORDERS_PER_FILE
    stored = read_topic(spark, job.bootstrap, job.topic).collect()
    offsets_by_file = {}
    for path in orders:
        with open(path, "rb") as f:
            offsets_by_file[f"ingest-plain/{os.path.basename(path)}"] = _line_offsets(f.read())
    assert sorted((row[PRODUCER_NAME], row[SEQUENCE_ID]) for row in stored) == sorted(
        (name, offset) for name, offsets in offsets_by_file.items() for offset in offsets)
    # Each name's records reach each partition in sequence order (what per-record deduplication relies on).
    for name in offsets_by_file:
        for partition in (0, 1):
            ids_in_offset_order = [row[SEQUENCE_ID] for row in sorted(stored, key=lambda r: r.offset)
                                   if row[PRODUCER_NAME] == name and row.partition == partition]
            assert ids_in_offset_order == sorted(ids_in_offset_order)
    report = audit_ingest(spark, job)
    assert (report.expected, report.stored, report.duplicates, report.missing) == (300, 300, 0, 0)


def _line_offsets(data: bytes) -> list[int]:
    offsets, position = [], 0
    for line in data.splitlines(keepends=True):
        offsets.append(position)
        position += len(line)
    return offsets


def test_ingest_positions_of_csv_and_parquet_inputs(spark, spark_broker, tmp_path):
    """CSV: the byte offset of each line after the header; Parquet: the row index."""
    csv_path = tmp_path / "people.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "name"])
        writer.writerows([[i, f"name-{i}"] for i in range(20)])
    parquet_path = str(tmp_path / "people.parquet")
    spark.range(30).select(F.col("id"), F.concat(F.lit("p-"), "id").alias("name")).coalesce(1).write.parquet(
        parquet_path)
    parquet_file = next(os.path.join(parquet_path, f) for f in os.listdir(parquet_path) if f.endswith(".parquet"))
    job = IngestJob(name="formats", inputs=[str(csv_path), parquet_file], topic="ingest-formats",
                    bootstrap=spark_broker.bootstrap, key_field="id", partitions=2)
    run_ingest(spark, job)
    stored = {(row[PRODUCER_NAME], row[SEQUENCE_ID]): (row.key, row.value)
              for row in read_topic(spark, job.bootstrap, job.topic).collect()}
    csv_offsets = _line_offsets(csv_path.read_bytes())[1:]
    assert stored[("formats/people.csv", csv_offsets[3])] == ("3", '{"id":"3","name":"name-3"}')
    assert stored[("formats/" + os.path.basename(parquet_file), 7)] == ("7", '{"id":7,"name":"p-7"}')
    assert len(stored) == 50


def test_ingest_a_table_directory_and_a_glob_names_each_file(spark, spark_broker, tmp_path):
    """A Parquet directory of three part files and a glob of two JSON-lines files: positions start again in every
    file, so each file is a name of its own and every row is stored, none dropped as another file's duplicate."""
    table = str(tmp_path / "people.parquet")
    spark.range(90).select("id", F.concat(F.lit("p-"), "id").alias("name")).repartition(3).write.parquet(table)
    parts = sorted(f for f in os.listdir(table) if f.endswith(".parquet"))
    assert len(parts) == 3  # control: row indexes 0.. repeat in each part file
    for day in (1, 2):
        with open(tmp_path / f"day-{day}.jsonl", "w") as f:
            f.writelines(json.dumps({"id": f"d{day}-{i}"}) + "\n" for i in range(10))
    job = IngestJob(name="tables", inputs=[table, str(tmp_path / "day-*.jsonl")], topic="ingest-tables",
                    bootstrap=spark_broker.bootstrap, key_field="id", partitions=2)
    assert run_ingest(spark, job).written == 110
    stored = read_topic(spark, job.bootstrap, job.topic).collect()
    assert sorted(row.key for row in stored) == sorted([str(i) for i in range(90)] +
                                                       [f"d{d}-{i}" for d in (1, 2) for i in range(10)])
    assert {row[PRODUCER_NAME] for row in stored} == {f"tables/people.parquet/{part}" for part in parts} | {
        "tables/day-1.jsonl", "tables/day-2.jsonl"}
    report = audit_ingest(spark, job)
    assert (report.expected, report.stored, report.duplicates, report.missing) == (110, 110, 0, 0)


@pytest.mark.parametrize("sequence_ids", [True, False], ids=ids)
def test_ingest_task_retries(spark, spark_broker, orders, sequence_ids):
    """Needs per-record deduplication (with sequence ids). Every task's first attempt fails after handing rows to
    the sink; Spark retries it (local[2,4]) and the retry writes them again."""
    job = ingest_job(spark_broker, f"ingest-retries-{sequence_ids}", orders, sequence_ids)
    run_ingest(spark, job, Faults(fail_after_rows=FAIL_AFTER_ROWS))
    check(audit_ingest(spark, job), sequence_ids)


@pytest.mark.parametrize("sequence_ids", [True, False], ids=ids)
def test_ingest_concurrent_attempts(spark, spark_broker, orders, sequence_ids):
    """Needs per-record deduplication (with sequence ids). What speculative execution does: two attempts of the same
    tasks write the same records at once. Local mode never launches a speculative copy (Spark runs one only on
    another host), so two copies of the job run side by side instead."""
    job = ingest_job(spark_broker, f"ingest-concurrent-{sequence_ids}", orders, sequence_ids)
    run_ingest(spark, job)  # creates the topic before the race
    end_before = end_offsets(spark_broker.bootstrap, job.topic)
    errors = []
    runs = [threading.Thread(target=lambda: _capture(errors, run_ingest, spark, job)) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(300)
    assert not errors
    assert end_offsets(spark_broker.bootstrap, job.topic) == end_before * 3  # both copies sent every record
    report = audit_ingest(spark, job)
    assert report.missing == 0
    assert report.duplicates == (0 if sequence_ids else 2 * report.expected)


def _capture(errors: list, function, *args) -> None:
    try:
        function(*args)
    except Exception as exc:  # reported by the test's assertion
        errors.append(exc)


@pytest.mark.parametrize("sequence_ids", [True, False], ids=ids)
def test_ingest_driver_killed_mid_job_and_rerun(spark, spark_broker, orders, tmp_path, sequence_ids):
    """Needs per-record deduplication (with sequence ids). The driver (a `kop pipeline ingest` process, its JVM and
    Python workers) is killed -9 once part of the records are stored; the job is run again."""
    job = ingest_job(spark_broker, f"ingest-driver-kill-{sequence_ids}", orders, sequence_ids)
    stored_at_kill = kill_driver_mid_ingest(job, ROW_DELAY_MS, str(tmp_path / "driver.log"))
    assert 0 < stored_at_kill < 2 * ORDERS_PER_FILE, "the driver was not killed mid-job"
    run_ingest(spark, job)
    check(audit_ingest(spark, job), sequence_ids)


@pytest.mark.parametrize("sequence_ids", [True, False], ids=ids)
def test_ingest_broker_killed_mid_job(spark, spark_broker, orders, sequence_ids):
    """Needs per-record deduplication (with sequence ids). kop is killed -9 while the job writes and restarted
    after longer than the producer's message timeout, so the tasks fail and are retried (the job re-run if it runs
    out of retries)."""
    job = ingest_job(spark_broker, f"ingest-broker-kill-{sequence_ids}", orders, sequence_ids,
                     kafka_options={"message.timeout.ms": "2000", "reconnect.backoff.max.ms": "500"})
    stored_at_kill = kill_broker_mid_job(
        spark_broker, job.topic, lambda: run_ingest(spark, job, Faults(row_delay_ms=ROW_DELAY_MS)), down_s=4)
    assert 0 < stored_at_kill < 2 * ORDERS_PER_FILE, "kop was not killed mid-job"
    check(audit_ingest(spark, job), sequence_ids)


def test_ingest_resume_skips_what_kop_stores(spark, spark_broker, orders):
    """Needs kop's last-sequence-id query. A first run stores everything; a resumed run writes nothing, and a run
    over a grown file writes only the new records."""
    inputs = [shutil.copy(orders[0], os.path.join(os.path.dirname(orders[0]), "resume.jsonl"))]
    job = ingest_job(spark_broker, "ingest-resume", inputs, resume=True)
    assert run_ingest(spark, job).written == ORDERS_PER_FILE
    assert run_ingest(spark, job).written == 0
    generate_orders(inputs[0] + ".more", 20, seed=99)
    with open(inputs[0], "ab") as grown, open(inputs[0] + ".more", "rb") as more:
        grown.write(more.read())
    assert run_ingest(spark, job).written == 20
    report = audit_ingest(spark, job)
    assert (report.stored, report.duplicates, report.missing) == (ORDERS_PER_FILE + 20, 0, 0)


# ---- transform


def transform_job(broker, output: str, input_topic: str, checkpoint: str, sequence_ids: bool) -> TransformJob:
    return TransformJob(name=output, input_topic=input_topic, output_topic=output, bootstrap=broker.bootstrap,
                        checkpoint=checkpoint, function=enrich_and_aggregate, partitions=2,
                        sequence_ids=sequence_ids)


@pytest.mark.parametrize("sequence_ids", [True, False], ids=ids)
def test_transform_restarts_from_old_checkpoint_and_from_none(spark, spark_broker, orders, tmp_path,
                                                               sequence_ids):
    """Needs per-record deduplication (with sequence ids). The transform runs over half the input, its checkpoint is
    kept, it runs over the rest with task failures, then again from the old checkpoint (a driver that crashed before
    committing), then from no checkpoint at all: each output is stored once."""
    output = f"transform-{sequence_ids}"
    first_half = ingest_job(spark_broker, f"transform-input-{sequence_ids}", orders[:1])
    run_ingest(spark, first_half)
    transform_input = first_half.topic
    checkpoint, old_checkpoint = str(tmp_path / "checkpoint"), str(tmp_path / "old-checkpoint")
    job = transform_job(spark_broker, output, transform_input, checkpoint, sequence_ids)
    first = run_transform(spark, job)
    assert first.records_in > 0 and first.records_out > first.records_in  # orders of several categories
    shutil.copytree(checkpoint, old_checkpoint)
    run_ingest(spark, ingest_job(spark_broker, transform_input, orders[1:]))
    assert run_transform(spark, job, Faults(fail_after_rows=FAIL_AFTER_ROWS)).records_in == ORDERS_PER_FILE
    replayed = run_transform(spark, transform_job(spark_broker, output, transform_input, old_checkpoint,
                                                  sequence_ids))
    assert replayed.records_in == ORDERS_PER_FILE
    assert run_transform(spark, transform_job(spark_broker, output, transform_input, str(tmp_path / "none"),
                                              sequence_ids)).records_in == end_offsets(spark_broker.bootstrap,
                                                                                        transform_input)
    report = audit(spark, expected_outputs(spark, output, transform_input, spark_broker.bootstrap,
                                           enrich_and_aggregate), spark_broker.bootstrap, output)
    check(report, sequence_ids)


def test_transform_of_a_transactional_input_reads_committed_records_only(spark, spark_broker, tmp_path):
    """The input written by transactions: the transform skips the aborted one and stops before the open one, whose
    records the next run picks up once it commits."""
    input_topic, output = "transform-txn-input", "transform-txn-output"
    ensure_topic(spark_broker.bootstrap, input_topic, 1)
    ck_open_transaction(spark_broker.bootstrap, input_topic, "c", 3).commit_transaction(15)
    ck_open_transaction(spark_broker.bootstrap, input_topic, "a", 2).abort_transaction(15)
    still_open = ck_open_transaction(spark_broker.bootstrap, input_topic, "o", 2)
    job = TransformJob(name=output, input_topic=input_topic, output_topic=output, bootstrap=spark_broker.bootstrap,
                       checkpoint=str(tmp_path / "checkpoint"), partitions=1,
                       function=lambda batch: batch.select("key", "value", "partition", "offset"))
    assert run_transform(spark, job).records_in == 3
    assert sorted(row.value for row in read_topic(spark, spark_broker.bootstrap, output).collect()) == \
        ["c0", "c1", "c2"]
    still_open.commit_transaction(15)
    assert run_transform(spark, job).records_in == 2
    assert sorted(row.value for row in read_topic(spark, spark_broker.bootstrap, output).collect()) == \
        ["c0", "c1", "c2", "o0", "o1"]


def test_audit_report_and_chart(spark, spark_broker, orders, tmp_path):
    """The audit of a run that stored duplicates says so, per name and per key, in JSON and in a PNG."""
    job = ingest_job(spark_broker, "audit-report", orders[:1])
    run_ingest(spark, job)
    run_ingest(spark, job)  # without deduplication by headers, twice; with it, once
    report = audit_ingest(spark, job)
    write_json(report, str(tmp_path / "audit.json"))
    write_chart(report, str(tmp_path / "audit.png"))
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["expected"] == ORDERS_PER_FILE
    assert saved["exactly_once"] == (saved["duplicates"] == 0 and saved["missing"] == 0)
    assert [n["producer_name"] for n in saved["names"]] == ["audit-report/orders-a.jsonl"]
    assert saved["names"][0]["stored"] == saved["stored"]
    assert saved["names"][0]["duplicates"] == saved["duplicates"]
    assert sum(k["expected"] for k in saved["keys"]) == ORDERS_PER_FILE
    assert sum(k["stored"] for k in saved["keys"]) == saved["stored"]
    assert (tmp_path / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
