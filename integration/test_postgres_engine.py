"""The PostgreSQL engine's own faults: kill -9 of kop mid-produce, and PostgreSQL itself restarted mid-produce.
Acknowledged records are all stored exactly once, in order per partition. These run in `make test` too, whatever
engine the rest of the session uses: they are its smoke test."""
import threading
import time

import pytest

from integration.broker_process import BrokerProcess, free_port
from integration.idem_raw import RawKafka, read_topic
from integration.idem_stream import Report, check_stream, stream_values
from integration.postgres_server import PostgresServer, server_binaries
from integration.test_idempotence_crash import PARTITIONS, STREAM_TIMEOUT_S, _crash_run, confluent_reports, \
    stored_count
from integration.waiting import wait_until
from protocol.errors import ErrorCode
from protocol.records import iter_records, split_batches

COUNT = 10_000


@pytest.fixture
def pg_broker_factory(tmp_path, postgres_url):
    """Brokers on the PostgreSQL engine (one database for all of this test's brokers)."""
    started = []

    def make(config: dict[str, str] | None = None, name: str = "data", **options) -> BrokerProcess:
        """options: BrokerProcess's own (admin_port, ...)."""
        proc = BrokerProcess(str(tmp_path / name), config=dict(config or {}), options=("--storage", postgres_url),
                             **options)
        started.append(proc.start())
        return proc

    yield make
    for proc in started:
        proc.stop()


def test_topics_and_records_live_in_postgresql_not_in_the_data_directory(pg_broker_factory, tmp_path):
    broker = pg_broker_factory()
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("t", 2) == ErrorCode.NONE
    from integration.clients import ck_consume_all, ck_produce, sample_records
    records = sample_records(20)
    ck_produce(broker.bootstrap, "t", records, partition=1)
    with RawKafka(broker.port) as kafka:
        first_pid = kafka.init_producer_id().producer_id
        stable_generation(kafka, "g")
    broker.stop()
    assert not (tmp_path / "data" / "ledgers").exists() and not (tmp_path / "data" / "topics").exists()
    # A new data directory on the same database: the broker is stateless, everything comes from PostgreSQL.
    moved = pg_broker_factory(name="elsewhere")
    got = ck_consume_all(moved.bootstrap, "t", len(records), partitions=(1,))
    assert [r.value for r in got] == [r[1] for r in records]
    with RawKafka(moved.port) as kafka:  # ids come from the database too: never one an earlier producer had
        assert kafka.init_producer_id().producer_id > first_pid
        assert stable_generation(kafka, "g") == 2  # and group generations: they keep rising


def stable_generation(kafka: RawKafka, group: str) -> int:
    """Join `group` alone and sync: the generation it reached."""
    from integration.test_groups_protocol import REQ, RESP, join
    Sync = REQ[14][0]
    joined = join(kafka, 0, group)
    assert joined.error_code == ErrorCode.NONE
    synced = kafka.call(Sync(group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
                             assignments=[Sync.SyncGroupRequestAssignment(member_id=joined.member_id,
                                                                          assignment=b"a")]), RESP[14], 0)
    assert synced.error_code == ErrorCode.NONE
    return joined.generation_id


@pytest.mark.slow  # three restarts of kop on PostgreSQL: ~15-20 s
def test_idempotent_stream_survives_three_kill_9_of_kop(pg_broker_factory):
    check, _ = _crash_run(pg_broker_factory, "confluent", dedup=True)
    assert check.lost == 0 and check.foreign == 0 and check.duplicated == 0, check.summary()
    assert check.out_of_order == 0 and check.holes == 0 and check.offset_mismatches == 0, check.summary()
    assert check.failed == 0, check.summary()


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own, which it restarts."""
    bin_dir = server_binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql (`make postgres` installs them)")
    server = PostgresServer(bin_dir, free_port()).init().start()
    yield server
    server.stop("immediate")
    server.remove()


def test_idempotent_stream_survives_postgresql_restarts(own_postgres, tmp_path):
    url = own_postgres.create_database("kop")
    broker = BrokerProcess(str(tmp_path / "data"), options=("--storage", url)).start()
    try:
        topic = "pg-restart"
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
        values = stream_values(topic, COUNT)
        reports: list[Report] = []
        running = threading.Event()
        running.set()
        thread = threading.Thread(target=confluent_reports, args=(broker.bootstrap, topic, values, running, reports),
                                  daemon=True)
        thread.start()
        at_restarts = []
        try:
            for k in (1, 2):
                assert wait_until(lambda: (stored_count(broker.port, topic) or 0) >= COUNT * k // 3
                                  or not running.is_set(), timeout=STREAM_TIMEOUT_S / 2)
                assert running.is_set(), f"the stream ended before restart {k}"
                at_restarts.append(stored_count(broker.port, topic))
                own_postgres.stop("immediate")  # as a crash: no checkpoint, recovery from the WAL at start
                time.sleep(1)
                own_postgres.start()
        finally:
            thread.join(STREAM_TIMEOUT_S + 30)
        assert not thread.is_alive(), "the producer did not finish"
        check = check_stream(values, reports, read_topic(broker.port, topic, range(PARTITIONS)))
        log = open(broker.log_path, errors="replace").read()
    finally:
        broker.stop()
    print(f"\n[PostgreSQL restarted x2] stored at restarts={at_restarts} {check.summary()}")
    assert "write failed" in log, "no write failed: the restarts did not land mid-produce"  # the control
    assert all(n is not None and n < COUNT for n in at_restarts)
    assert check.lost == 0 and check.foreign == 0 and check.duplicated == 0, check.summary()
    assert check.out_of_order == 0 and check.holes == 0 and check.offset_mismatches == 0, check.summary()
    assert check.failed == 0 and check.stored == COUNT, check.summary()


def test_a_second_broker_with_the_same_node_id_is_refused_with_one_line(pg_broker_factory, tmp_path, postgres_url):
    pg_broker_factory()
    second = BrokerProcess(str(tmp_path / "second"), options=("--storage", postgres_url))
    with pytest.raises(RuntimeError, match="node.id 1 is in use by a live broker on this database"):
        second.start(timeout=15)
    assert "Traceback" not in second.log_tail()


def test_an_unreachable_database_stops_the_start_with_one_line(tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"),
                           options=("--storage", f"postgresql://kop:secret@127.0.0.1:{free_port()}/kop"))
    with pytest.raises(RuntimeError, match="cannot use PostgreSQL at postgresql://kop:\\*\\*\\*@127.0.0.1"):
        broker.start(timeout=15)
    assert "Traceback" not in broker.log_tail() and "secret" not in broker.log_tail()


def test_a_deleted_topic_leaves_no_rows_and_comes_back_empty(pg_broker_factory, postgres_url):
    import asyncio

    import asyncpg

    async def rows() -> dict[str, int]:
        conn = await asyncpg.connect(postgres_url)
        try:
            # (the group coordinators' shard rows of kop_managed_ledger belong to no topic: not counted)
            return {table: await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {where}")
                    for table, where in (("kop_managed_ledger", "name NOT LIKE 'kop.coordinator/%'"),
                                         ("kop_ledger", "true"), ("kop_entry", "true"), ("kop_cursor", "true"),
                                         ("kop_record", "true"))}
        finally:
            await conn.close()

    broker = pg_broker_factory()
    from integration.clients import ck_consume_all, ck_produce, sample_records
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("phoenix", 2) == ErrorCode.NONE
    ck_produce(broker.bootstrap, "phoenix", sample_records(5), partition=0)
    stored = asyncio.run(rows())
    assert stored["kop_entry"] > 0 and stored["kop_record"] == 1  # the control: the topic was there
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.delete_topics(["phoenix"])
    finally:
        admin.close()
    assert asyncio.run(rows()) == {"kop_managed_ledger": 0, "kop_ledger": 0, "kop_entry": 0, "kop_cursor": 0,
                                   "kop_record": 0}
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("phoenix", 2) == ErrorCode.NONE
    ck_produce(broker.bootstrap, "phoenix", sample_records(1, prefix="new"), partition=0)
    assert [r.value for r in ck_consume_all(broker.bootstrap, "phoenix", 1)] == [b"new-0"]


# Partition FAIL_AT of the topic cannot be opened: PostgreSQL itself refuses its managed ledger's row (a trigger of
# the test's database), while the partitions before it are opened, and stored, a bounded number at a time.
FAIL_AT = 150
OPEN_FAULT = f"""
CREATE TABLE test_opened (name text);
CREATE FUNCTION test_refuse_one() RETURNS trigger AS $$
BEGIN
    IF NEW.name = 'public/default/wide-partition-{FAIL_AT}' THEN
        RAISE EXCEPTION 'injected: the database refuses %', NEW.name;
    END IF;
    INSERT INTO test_opened VALUES (NEW.name);  -- committed with the partition's own row: it was opened
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_refuse_one BEFORE INSERT ON kop_managed_ledger FOR EACH ROW EXECUTE FUNCTION test_refuse_one();
"""


def test_a_partition_that_cannot_be_opened_mid_creation_leaves_no_partition_of_the_topic(pg_broker_factory,
                                                                                         postgres_url):
    """New partitions are opened several at a time; when one fails, those being opened finish, none is started
    after it, and every one opened is closed and its rows removed: the request gets KAFKA_STORAGE_ERROR, the topic
    does not exist, and once the fault is gone the same topic is created whole."""
    import asyncio

    import asyncpg

    from integration.clients import ck_consume_all, ck_produce, sample_records
    from kop.topics import OPEN_CONCURRENCY

    async def sql(statement: str, value: bool = True):
        """The statement's value (value=False: statements run for their effect)."""
        conn = await asyncpg.connect(postgres_url)
        try:
            return await (conn.fetchval(statement) if value else conn.execute(statement))
        finally:
            await conn.close()

    broker = pg_broker_factory()
    asyncio.run(sql(OPEN_FAULT, value=False))
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("wide", 2 * FAIL_AT) == ErrorCode.KAFKA_STORAGE_ERROR
        # Controls: the partitions before the refused one were opened and stored, and few after it were started.
        opened = asyncio.run(sql("SELECT count(*) FROM test_opened WHERE name LIKE 'public/default/wide-%'"))
        assert FAIL_AT <= opened < FAIL_AT + OPEN_CONCURRENCY
        assert "injected: the database refuses public/default/wide-partition-150" in broker.log_tail(200)
        for table in ("kop_managed_ledger", "kop_ledger", "kop_entry", "kop_cursor"):
            left = asyncio.run(sql(f"SELECT count(*) FROM {table} WHERE name LIKE 'public/default/wide-%'"))
            assert left == 0, f"{left} rows of the uncreated topic left in {table}"
        assert asyncio.run(sql("SELECT count(*) FROM kop_record WHERE key = 'public/default/wide'")) == 0
        assert kafka.create_topic("wide", 2 * FAIL_AT) == ErrorCode.KAFKA_STORAGE_ERROR  # not half there either
        asyncio.run(sql("DROP TRIGGER test_refuse_one ON kop_managed_ledger", value=False))
        assert kafka.create_topic("wide", 2 * FAIL_AT) == ErrorCode.NONE
    records = sample_records(3)
    ck_produce(broker.bootstrap, "wide", records, partition=FAIL_AT)
    assert [r.value for r in ck_consume_all(broker.bootstrap, "wide", 3, partitions=(FAIL_AT,))] == \
        [r[1] for r in records]
    assert "Traceback" not in broker.log_tail(400)


def test_describe_log_dirs_names_the_database(pg_broker_factory, postgres_url):
    from kafka.admin import KafkaAdminClient
    broker = pg_broker_factory()
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("placed", 1) == ErrorCode.NONE
    from integration.clients import ck_produce, sample_records
    ck_produce(broker.bootstrap, "placed", sample_records(3), partition=0)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (described,) = admin.describe_log_dirs()
    finally:
        admin.close()
    (log_dir,) = described["log_dirs"]
    assert log_dir["error_code"] == ErrorCode.NONE and log_dir["log_dir"] == postgres_url
    assert log_dir["total_bytes"] == -1 and log_dir["usable_bytes"] == -1
    (topic,) = log_dir["topics"]
    assert topic["name"] == "placed" and topic["partitions"][0]["partition_size"] > 0


CACHE_BOUND = 64 << 10
BATCH_BYTES = 16 << 10  # the producer's batch.size: an entry is at most about this big


@pytest.mark.slow  # two starts of kop on PostgreSQL and 4 MiB: ~15-20 s
def test_a_takeover_reads_a_partition_many_times_its_entry_cache_back_in_order(pg_broker_factory):
    """A broker whose entry cache is bounded takes over a partition of 4 MiB, 64 times its bound: a consumer reading
    from offset 0 gets every record in order (the reads the cache misses come back short and are read back from
    PostgreSQL), while the bytes the broker holds stay within the bound (its own count, on /metrics)."""
    from integration.clients import ck_consume_all, ck_produce
    from integration.test_metrics import sample, scrape
    records = [(None, b"%06d" % i + bytes([i % 251]) * 1018, [], 0) for i in range(4096)]  # 1 KiB values
    config = {"managed.ledger.cache.bytes": str(CACHE_BOUND)}
    first = pg_broker_factory(config)
    ck_produce(first.bootstrap, "big", records, **{"batch.size": BATCH_BYTES, "linger.ms": 5})
    first.stop()
    broker = pg_broker_factory(config, name="takeover", admin_port=0)

    def cache_within_bound() -> dict:
        samples = scrape(broker)
        assert sample(samples, "kop_managed_ledger_cache_max_bytes") == CACHE_BOUND
        assert 0 < sample(samples, "kop_managed_ledger_cache_entries")
        assert sample(samples, "kop_managed_ledger_cache_bytes") <= CACHE_BOUND + BATCH_BYTES
        return samples

    cache_within_bound()  # right after the takeover: the index, and a tail within the bound
    got = ck_consume_all(broker.bootstrap, "big", len(records), timeout=60)
    assert [r.offset for r in got] == list(range(len(records)))
    assert [r.value for r in got] == [r[1] for r in records]
    samples = cache_within_bound()
    # control: the reads did miss and read entries back, and the cache dropped entries to keep within its bound
    assert sample(samples, "kop_managed_ledger_cache_misses_total") > 0
    assert sample(samples, "kop_managed_ledger_cache_evictions_total") > 0


@pytest.mark.slow  # two starts of kop on PostgreSQL: ~8 s
def test_a_fetch_that_will_not_wait_gets_records_its_entry_cache_missed(pg_broker_factory):
    """Fetch with max_wait_ms 0 answers at once with what is stored: records the bounded entry cache no longer holds
    are read back first, not answered as nothing (a client reading that way would see an empty partition below its
    high watermark). The cache's miss counter is the control that the read did miss."""
    from integration.clients import ck_produce
    from integration.test_metrics import sample, scrape
    records = [(None, b"%06d" % i + b"x" * 1018, [], 0) for i in range(512)]  # 512 KiB, 8 times the bound
    config = {"managed.ledger.cache.bytes": str(CACHE_BOUND)}
    first = pg_broker_factory(config)
    ck_produce(first.bootstrap, "cold", records, **{"batch.size": BATCH_BYTES, "linger.ms": 5})
    first.stop()
    broker = pg_broker_factory(config, name="takeover", admin_port=0)
    with RawKafka(broker.port) as kafka:
        error, high_watermark, data = kafka.fetch_once("cold", 0, 0, max_bytes=BATCH_BYTES)
    assert (error, high_watermark) == (ErrorCode.NONE, len(records))
    [first_record, *_] = [r for _, view in split_batches(data) for r in iter_records(view)]
    assert (first_record.offset, first_record.value) == (0, records[0][1])
    assert sample(scrape(broker), "kop_managed_ledger_cache_misses_total") > 0
