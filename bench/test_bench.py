"""The benchmarks' own checks: their helpers compute what they claim, and each benchmark, run tiny against a real
broker, moves and counts the records it says it does. No assertion here is about speed.

    python -m pytest bench/test_bench.py
"""
import asyncio
import glob
import os
import shutil
import time

import pytest

from bench import consume, recovery
from bench.brokers import create_topic, running_broker
from bench.pipelined_producer import BatchTemplate, ProducerIdentity, load_partition
from bench.procstat import cpu_seconds, directory_bytes
from bench.produce import ProduceSpec, produce, table
from bench.profile_produce import fold
from bench.report import Table
from bench.stats import interleaved_order, paired_ratios, percentile


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 0.50) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([7.0], 0.99) == 7.0


def test_rounds_alternate_direction_so_no_variant_always_runs_first():
    assert interleaved_order(3, 0) == [0, 1, 2]
    assert interleaved_order(3, 1) == [2, 1, 0]


def test_ratios_pair_rounds_and_skip_a_zero_baseline():
    assert paired_ratios([2.0, 3.0, 5.0], [1.0, 0.0, 10.0]) == [2.0, 0.5]


def test_cpu_seconds_counts_this_process_work():
    before = cpu_seconds(os.getpid())
    sum(i * i for i in range(300_000))
    assert cpu_seconds(os.getpid()) > before


def test_directory_bytes_sums_nested_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"1" * 10)
    (tmp_path / "y").write_bytes(b"2" * 5)
    assert directory_bytes(str(tmp_path)) == 15


def test_fold_counts_leaf_as_self_and_every_frame_once_as_total():
    raw = ["main (kop/cli.py:10);handle (kop/handlers/produce.py:50);_walk (protocol/records.py:300) 3",
           "main (kop/cli.py:10);handle (kop/handlers/produce.py:51) 1",
           "main (kop/cli.py:10);main (kop/cli.py:12) 2"]
    profile = fold(raw)
    by_name = {f.function: f for f in profile.functions}
    assert profile.samples == 6
    assert by_name["_walk (records.py)"].self_samples == 3
    assert by_name["handle (produce.py)"].self_samples == 1
    assert by_name["handle (produce.py)"].total_samples == 4
    assert by_name["main (cli.py)"].total_samples == 6  # recursion counted once per sample
    assert profile.functions[0].function == "_walk (records.py)"


def test_batch_template_patches_sequence_and_keeps_a_valid_crc():
    from protocol.records import split_batches, validate_batch
    template = BatchTemplate(ProducerIdentity(producer_id=42, epoch=3), b"value")
    for sequence in (0, 1, 123_456):
        header, view = split_batches(bytes(template.batch(sequence)))[0]
        validate_batch(header, view)  # raises on a bad CRC
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, sequence)


def test_table_rejects_a_row_of_the_wrong_width():
    t = Table("t", ["a", "b"])
    t.add("1", "2")
    with pytest.raises(ValueError):
        t.add("1")
    assert t.markdown().splitlines()[2] == "| 1 | 2 |"


def test_produce_delivers_every_record_and_consume_reads_them_all_back():
    spec = ProduceSpec(records=2_000, record_bytes=100, partitions=2, idempotence=True, compression="lz4")
    with running_broker() as broker:
        create_topic(broker.bootstrap, "bench-test", spec.partitions)
        result = produce(broker.bootstrap, "bench-test", spec, broker.proc.pid)
        assert (result.delivered, result.failed) == (2_000, 0)
        assert result.p50_ms <= result.p99_ms
        read = consume.consume_all(broker.bootstrap, "bench-test", spec.partitions, 2_000 + spec.partitions,
                                   broker.proc.pid, timeout_s=60)
    assert read.records == 2_000 + spec.partitions  # one warm-up record per partition
    assert read.value_bytes == 2_000 * 100 + spec.partitions * len(b"warm-up")
    assert len(table([[result]], "t").rows) == 1


def stored_sequence_ids(bootstrap: str, topic: str, partitions: int, expected: int) -> list[tuple[bytes, bytes]]:
    """(kop.producer.name, kop.sequence.id) of every record read back that carries them."""
    from integration.clients import ck_consume_all
    records = ck_consume_all(bootstrap, topic, expected, partitions=range(partitions))
    found = []
    for record in records:
        headers = dict(record.headers)
        if "kop.producer.name" in headers:
            found.append((headers["kop.producer.name"], headers["kop.sequence.id"]))
    return found


@pytest.mark.slow  # 10-25 s: a broker, and two Python processes or a JVM
@pytest.mark.parametrize("driver, producers", [("confluent-kafka", 2), ("java", 1)])
def test_a_load_of_several_processes_or_the_java_client_stores_every_record_with_its_sequence_id(driver, producers):
    if driver == "java":
        from integration.java_client import java_available, java_unavailable_reason
        if not java_available():
            pytest.skip(java_unavailable_reason())
    spec = ProduceSpec(records=2_000, record_bytes=100, partitions=2, idempotence=True, headers="sequence",
                       producers=producers, driver=driver)
    with running_broker() as broker:
        create_topic(broker.bootstrap, "bench-test", spec.partitions)
        result = produce(broker.bootstrap, "bench-test", spec, broker.proc.pid)
        assert (result.delivered, result.failed) == (2_000, 0)
        assert result.broker_cpu_s > 0 and result.client_cpu_s > 0
        found = stored_sequence_ids(broker.bootstrap, "bench-test", spec.partitions, 2_000 + producers * 2)
    assert len(found) == 2_000  # each record once, none dropped as a duplicate
    assert len(set(found)) == 2_000


def test_pipelined_producers_write_one_entry_per_batch_with_contiguous_sequences():
    from integration.idem_raw import read_topic
    with running_broker() as broker:
        create_topic(broker.bootstrap, "bench-load", 1)
        loaded = asyncio.run(asyncio.wait_for(
            load_partition("127.0.0.1", broker.port, "bench-load", 0, 301, connections=3), 60))
        stored = read_topic(broker.port, "bench-load", [0], timeout=60)
    assert loaded.entries == 301
    assert [r.offset for r in stored] == list(range(301))
    by_producer: dict[int, list[int]] = {}
    for r in stored:
        by_producer.setdefault(r.producer_id, []).append(r.base_sequence)
    assert sorted(len(s) for s in by_producer.values()) == [100, 100, 101]
    assert all(s == list(range(len(s))) for s in by_producer.values())


@pytest.mark.slow  # ~17 s: kill -9 and a restart
def test_recovery_probe_resumes_a_producer_after_kill_9():
    result = recovery.run([200], restarts=2, connections=2, tail=30, progress=lambda _: None)
    (checkpoint,) = result.checkpoints
    assert len(result.empty_start_s) == 2
    assert [r.fatal_error for r in checkpoint.restarts] == [0, 0]
    assert checkpoint.entries == 200 + 2 * 30 + 2  # each acknowledged probe added one entry
    assert all(r.listening_s <= r.first_ack_s for r in checkpoint.restarts)


def test_dedup_core_measures_both_variants_over_accepted_batches():
    from bench import dedup_core
    costs = dedup_core.measure(batches=2_500, producers=3, rounds=2, partition_batches=2_100)  # 2 snapshots each
    assert [c.what for c in costs] == ["dedup core", "partition path"]
    for cost in costs:
        assert len(cost.off_us) == len(cost.on_us) == 2
        assert all(us > 0 for us in cost.off_us + cost.on_us)
    assert len(dedup_core.table(costs).rows) == 2


def test_sequence_path_measures_every_variant_side_by_side():
    from bench import sequence_path
    timed = sequence_path.measure_time(records=800, record_bytes=100, rounds=2, batch_records=100,
                                       progress=lambda _: None)
    assert set(timed) == set(sequence_path.VARIANTS) and all(len(v) == 2 and min(v) > 0 for v in timed.values())
    assert len(sequence_path.table(timed, None, "t").rows) == len(sequence_path.VARIANTS)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_dedup_instructions_counts_more_work_per_batch_with_dedup_on():
    from bench import dedup_instructions
    # Enough batches that dedup's work (thousands of instructions each) outweighs how much the start-up of the
    # process (about 10^9 instructions, counted too) varies from run to run.
    off = dedup_instructions.partition_path_instructions(False, 1500)
    on = dedup_instructions.partition_path_instructions(True, 1500)
    assert on - off > 1_000  # runs of nothing show none


def test_summary_chart_draws_every_panel_of_the_figures_file(tmp_path):
    from bench import summary_chart
    panels = summary_chart.read_panels(summary_chart.FIGURES)
    assert len(panels) == 4 and all(len(bars) >= 2 for bars in panels.values())
    output = tmp_path / "chart.png"
    summary_chart.draw(panels, output)
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_transactions_benchmark_writes_and_reads_what_it_counts():
    from bench import transactions
    with running_broker() as broker:
        create_topic(broker.bootstrap, transactions.TOPIC, transactions.PARTITIONS)
        produced = transactions.produce(broker.bootstrap, 200, 100, 20, broker.proc.pid, aborted_every=5)
        assert produced.records == 200 and len(produced.commit_ms) == 10
        committed = transactions.consume(broker.bootstrap, "read_committed", broker.proc.pid)
        everything = transactions.consume(broker.bootstrap, "read_uncommitted", broker.proc.pid)
    assert (committed.records, everything.records) == (160, 200)  # two of the ten transactions aborted


@pytest.mark.parametrize("name", ["kop", "tansu"])
def test_peers_benchmark_runs_each_broker_and_counts_every_record(name):
    from bench import peers
    produce_small = peers.Workload("produce", ProduceSpec(2000, 100, peers.PARTITIONS, idempotence=True))
    consume_small = peers.Workload("consume", ProduceSpec(2000, 100, peers.PARTITIONS), consume=True)
    assert peers.measure(name, produce_small).records == 2000
    assert peers.measure(name, consume_small).records == 2000 + peers.PARTITIONS  # with produce()'s warm-up records


@pytest.mark.slow  # ~20 s: two clusters
def test_geo_replication_catch_up_and_lag_count_every_record():
    from bench import geo_replication
    done = geo_replication.catch_up(backlog_mb=1)
    assert done.records == 1000 and done.megabytes > 1 and done.seconds > 0
    run = geo_replication.steady(rate=200, seconds=2)
    assert run.sent == run.received > 0 and 0 < len(run.lags_ms) < run.sent and min(run.lags_ms) > 0
    assert run.east_mb_s > 0 and run.west_mb_s > 0


@pytest.mark.slow  # ~15 s
def test_fetch_profile_measures_full_incremental_and_single_fetches_and_profiles_the_many_partition_ones():
    from bench import fetch_profile
    from bench.partitions import Spec
    figures, *profiles = fetch_profile.run(Spec(topics=4, partitions=3, producers=2), rounds=3)
    (full, incremental, one) = figures.rows
    answer_bytes = [int(row[1].replace(",", "")) for row in (full, incremental, one)]
    assert full[0].startswith("full, 12 partitions") and answer_bytes[0] > answer_bytes[2] > answer_bytes[1]
    assert len(profiles) == 2
    for profile in profiles:  # the profiler wrote statistics for each series
        assert profile.rows, profile.text()


def test_snapshot_rebuild_finds_every_stored_snapshot_thinned_to_the_cache():
    from bench import snapshot_rebuild
    seconds, cached = asyncio.run(snapshot_rebuild.rebuild_seconds(2 * snapshot_rebuild.EVERY))
    assert seconds > 0 and cached == 2  # two markers stored, both found
    seconds, cached = asyncio.run(snapshot_rebuild.rebuild_seconds(20 * snapshot_rebuild.EVERY))
    assert cached == snapshot_rebuild.SETTINGS.max_cached  # twenty found, thinned to the cache's size


def test_the_quick_comparison_runs_the_older_commit_from_its_own_tree():
    """bench.quick exports the older commit and starts its broker from there, so `-m kop.cli` imports that kop."""
    import subprocess
    import sys
    from bench import quick
    with quick.exported("HEAD") as tree:
        assert os.path.exists(os.path.join(tree, "kop", "cli.py"))
        where = subprocess.run([sys.executable, "-c", "import kop; print(kop.__file__)"], cwd=tree,
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        assert where == os.path.join(tree, "kop", "__init__.py")
        if shutil.which("cc"):  # its C part built, as pip install -e . builds this tree's: the same code compared
            assert glob.glob(os.path.join(tree, "protocol", "_accel*.so"))
        result = quick.measure(tree, ProduceSpec(200, 100, 4, idempotence=True))
        assert result.delivered == 200 and result.failed == 0


@pytest.mark.slow  # ~22 s
def test_txn_index_benchmark_measures_both_probes_on_what_it_wrote():
    from bench import txn_index
    state = asyncio.run(txn_index.probe(300))  # every lookup lists something; all 300 aborts found again
    assert state["count"] == 300 and state["state_bytes"] > 0 and state["snapshot_end_bytes"] > 0
    consumed = txn_index.consume_probe(200, rounds=1)  # read_committed gets the 200 committed records of 400
    assert [(r["isolation"], r["records"]) for r in consumed["reads"]] == [("read_uncommitted", 400),
                                                                           ("read_committed", 200)]
    assert "now" in txn_index.consume_table([consumed], {consumed["tree"]: "now"}).text()


def test_pg_compaction_lag_benchmark_measures_both_ways_side_by_side():
    from bench import pg_compaction_lag
    results = asyncio.run(pg_compaction_lag.measure(30, rounds=1))
    assert set(results) == {"yields every 2 ms", "never yields"}
    assert all(r["pass_s"] > 0 and r["idle_ticks"] > 0 for runs in results.values() for r in runs)
    assert "never yields" in pg_compaction_lag.table(results, 30)


def test_group_load_holds_live_members_that_heartbeat_and_leave():
    from bench.group_members import DESCRIBE_GROUPS, VERSIONS, GroupLoad
    from integration.idem_raw import RawKafka
    from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
    version = VERSIONS[DESCRIBE_GROUPS]

    def describe(raw, group_ids):
        request = REQUEST_CLASSES[DESCRIBE_GROUPS][version](groups=group_ids, include_authorized_operations=False)
        return {g.group_id: g for g in raw.call(request, RESPONSE_CLASSES[DESCRIBE_GROUPS], version).groups}

    with running_broker() as broker, RawKafka(broker.port) as raw:
        raw.create_topic("bench-groups", 1)
        load = GroupLoad(broker.port, "bench-groups", 3, heartbeat_ms=500)
        load.start()
        try:
            held = describe(raw, load.group_ids)
            deadline = time.monotonic() + 30
            while load.stats.heartbeats < 3 and time.monotonic() < deadline:  # one per member
                time.sleep(0.2)
                load.check()
        finally:
            load.stop()
        after = describe(raw, load.group_ids)
    assert [(g.group_state, [m.member_id for m in g.members]) for g in held.values()] == [
        ("Stable", [m.member_id]) for m in load.members]
    assert load.stats.heartbeats >= 3 and load.stats.rejoins == 0
    assert [(g.group_state, g.members) for g in after.values()] == [("Empty", [])] * 3


@pytest.mark.slow  # over 10 s (each round waits for the broker's memory to settle): make test-slow runs it
def test_connections_benchmark_reports_every_round_and_traces_the_broker(tmp_path, capsys):
    from bench.connections import Spec, run
    trace = str(tmp_path / "snap")
    result = run(Spec(connections=20, producers=3, groups=3, rounds=3, hold_s=1, heartbeat_ms=500, trace=trace))
    assert [row[0] for row in result.rows] == ["1", "2", "3"]
    assert all(cell.endswith("KiB") for cell in result.rows[0][1:4])
    assert all(row[4].count("MiB") == 2 and row[7].endswith("MiB") for row in result.rows)
    assert sorted(os.listdir(tmp_path)) == ["snap.1", "snap.2"]  # tracing from round 1's end, a snapshot after 2, 3
    assert "traced memory after rounds 2..: " in capsys.readouterr().err


def test_create_and_start_times_every_engine_and_finds_the_coordinators_in_the_log():
    from bench import create_and_start
    variants = [create_and_start.Variant(None, engine) for engine in create_and_start.ENGINES]
    results = create_and_start.run(variants, partitions=3, rounds=1, progress=lambda _: None)
    for variant, (timing,) in results.items():
        assert timing.start_s > 0 and timing.create_s > 0, variant
        assert 0 <= timing.coordinators_s < timing.start_s, variant  # both log lines found, in order
    assert "postgresql, this tree" in create_and_start.table(3, results).text()
