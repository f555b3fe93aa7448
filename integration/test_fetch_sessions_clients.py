"""Fetch sessions (KIP-227) with the clients that use them, kafka-python (topics by name, Fetch v12) and the Java
client (topics by id, Fetch v13+), consuming thousands of partitions: a record in each, then rounds of records to a
few partitions at a time while the others stay idle, read through byte-limited answers (so a session answers a
few partitions at a time, in turn). Every record arrives once and in order; the broker's counters show the fetches
were incremental (the control that sessions were used)."""
import json
import random
import threading
import time

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_unavailable_reason
from integration.test_groups_java import group_result, java_group_consume_lines
from integration.test_metrics import sample, scrape
from integration.waiting import wait_until
from protocol.errors import ErrorCode

PARTITIONS = 2000
ROUNDS = 8
PARTITIONS_PER_ROUND = 100
RECORDS_PER_PARTITION = 3
ROUND_PAUSE_S = 0.7  # the consumer's incremental fetches find nothing new between rounds
TOTAL = PARTITIONS + ROUNDS * PARTITIONS_PER_ROUND * RECORDS_PER_PARTITION


def expected_history(seed: int) -> tuple[list[tuple[int, str]], list[list[tuple[int, str]]]]:
    """(the first record of each partition, the rounds' records), as (partition, value)."""
    rng = random.Random(seed)
    first = [(p, f"{p}:first") for p in range(PARTITIONS)]
    rounds = [[(p, f"{p}:{r}:{i}") for p in rng.sample(range(PARTITIONS), PARTITIONS_PER_ROUND)
               for i in range(RECORDS_PER_PARTITION)] for r in range(ROUNDS)]
    return first, rounds


def produce(bootstrap: str, topic: str, records: list[tuple[int, str]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for partition, value in records:
        producer.produce(topic, value.encode(), partition=partition)
        producer.poll(0)
    assert producer.flush(60) == 0


def produce_rounds(bootstrap: str, topic: str, rounds: list[list[tuple[int, str]]]) -> None:
    for records in rounds:
        produce(bootstrap, topic, records)
        time.sleep(ROUND_PAUSE_S)


def check_once_and_in_order(consumed: list[tuple[int, int, str]], seed: int) -> None:
    """consumed: (partition, offset, value) in the order received."""
    first, rounds = expected_history(seed)
    want: dict[int, list[str]] = {}
    for partition, value in [*first, *(r for records in rounds for r in records)]:
        want.setdefault(partition, []).append(value)
    got: dict[int, list[tuple[int, str]]] = {}
    for partition, offset, value in consumed:
        got.setdefault(partition, []).append((offset, value))
    missing = {p: len(vs) - len(got.get(p, [])) for p, vs in want.items() if len(got.get(p, [])) < len(vs)}
    assert not missing, f"records missed in {len(missing)} partitions, e.g. {list(missing.items())[:5]}"
    wrong = [p for p, vs in want.items() if got[p] != list(enumerate(vs))]
    assert not wrong, f"partitions read out of order or twice: {[(p, got[p]) for p in wrong[:3]]}"


def assert_sessions_served(broker) -> None:
    metrics = scrape(broker)
    full = sample(metrics, "kop_fetch_session_requests_total", kind="full")
    incremental = sample(metrics, "kop_fetch_session_requests_total", kind="incremental")
    assert full >= 1 and incremental > 10 * full, (full, incremental)


@pytest.fixture
def many(start_broker):
    # fsync off: durability is not the subject here, and creating 2,000 partitions with it takes a minute under load
    broker = start_broker({"max.partitions.per.topic": str(PARTITIONS), "fsync": "false"})
    with RawKafka(broker.port, timeout=120) as raw:
        assert raw.create_topic("many", PARTITIONS) == ErrorCode.NONE
    first, _rounds = expected_history(0)
    produce(broker.bootstrap, "many", first)
    return broker


@pytest.mark.slow
def test_kafka_python_reads_every_record_once_through_incremental_fetches(many):
    seed = 0
    _first, rounds = expected_history(seed)
    consumer = KafkaConsumer(bootstrap_servers=many.bootstrap, enable_auto_commit=False, fetch_max_bytes=4096,
                             max_partition_fetch_bytes=1024, fetch_max_wait_ms=200, request_timeout_ms=60_000)
    consumed: list[tuple[int, int, str]] = []
    producer = threading.Thread(target=produce_rounds, args=(many.bootstrap, "many", rounds), daemon=True)
    try:
        consumer.assign([TopicPartition("many", p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 180
        while len(consumed) < TOTAL and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                consumed.extend((r.partition, r.offset, r.value.decode()) for r in batch)
            if not producer.is_alive() and not producer.ident and len(consumed) >= PARTITIONS // 2:
                producer.start()  # the session exists and has answered in turn for a while
        for batch in consumer.poll(timeout_ms=1000).values():  # nothing more should come
            consumed.extend((r.partition, r.offset, r.value.decode()) for r in batch)
    finally:
        consumer.close()
        producer.join(60)
    check_once_and_in_order(consumed, seed)
    assert_sessions_served(many)


@pytest.mark.slow
# Its own bounds (2 minutes for the first session, a minute per round's flush, 4 for the consumer) are past pytest's
# 300 s default: 130 s on PostgreSQL at load 10, where creating the 2,000 partitions alone takes 20-40 s
@pytest.mark.timeout(900)
@pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())
def test_the_java_client_reads_every_record_once_through_incremental_fetches_by_topic_id(many):
    seed = 1
    _first, rounds = expected_history(seed)
    lines: list[dict] = []

    def consume() -> None:
        lines.extend(java_group_consume_lines(
            many.bootstrap, "many", "sessions", max_records=TOTAL, commit="none", idle_ms=60_000, timeout=240,
            extra_props={"fetch.max.bytes": 4096, "max.partition.fetch.bytes": 1024, "fetch.max.wait.ms": 200}))

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert wait_until(lambda: sample(scrape(many), "kop_fetch_session_requests_total", kind="incremental") > 20,
                      timeout=120), "the Java consumer made no fetch session"
    produce_rounds(many.bootstrap, "many", rounds)
    consumer.join(240)
    result = group_result(lines)
    assert result.stop_reason == "max_records", json.dumps(lines[-3:])
    check_once_and_in_order([(r.partition, r.offset, r.value) for r in result.records], seed)
    assert_sessions_served(many)
