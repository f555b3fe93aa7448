"""kill -9 of the broker three times during an idempotent stream, restarting it each time on the same port and data
directory while the producer keeps retrying: nothing acknowledged is lost, nothing is stored twice, order is kept.

Kills are timed by the stored log (ListOffsets straight from the broker), not by the client, so the same driver
serves librdkafka and the Java client. The client talks through a FaultProxy that cuts nothing: it counts the error
codes of the Produce responses the client got (a report without an offset must come from a
DUPLICATE_SEQUENCE_NUMBER answer), and holds every response for a moment before each kill, so each kill surely
finds batches stored whose acknowledgements the client never got.
"""
import threading
import time

import pytest

from integration.fault_proxy import FaultProxy
from integration.idem_raw import RawKafka, read_topic
from integration.idem_stream import (DELIVERY_TIMEOUT_S, Report, check_stream, confluent_reporter, produce_when_room,
                                     stream_values)
from integration.waiting import wait_until
from integration.java_client import java_available, java_produce, java_unavailable_reason
from protocol.errors import ErrorCode

PARTITIONS = 3
KILLS = 3
# Small batches: many Produce requests in flight when a kill lands, each a retry whose outcome the client cannot know.
SMALL_BATCH_RECORDS = 50
SMALL_BATCH_BYTES = 1024
STREAM_TIMEOUT_S = 120
COUNT = 30_000


def stored_count(port: int, topic: str) -> int | None:
    """Records stored in the topic now; None while the broker does not answer."""
    try:
        with RawKafka(port, timeout=2) as kafka:
            return sum(kafka.end_offsets(topic, range(PARTITIONS)).values())
    except (OSError, RuntimeError):
        return None


def kill_three_times_while(broker, proxy: FaultProxy, topic: str, count: int,
                           running: threading.Event) -> list[int]:
    """kill -9 and restart at 1/4, 2/4 and 3/4 of the stream; returns the stored counts seen at each kill. Just
    before each kill the proxy holds the broker's answers until the client has batches stored but unacknowledged."""
    seen = []
    for k in range(1, KILLS + 1):
        threshold = count * k // (KILLS + 1)
        reached = wait_until(lambda: (stored_count(broker.port, topic) or 0) >= threshold or not running.is_set(),
                             timeout=STREAM_TIMEOUT_S / 2)
        assert reached and running.is_set(), f"the stream ended or stalled before kill {k} at {threshold} records"
        proxy.hold_responses(True)
        assert wait_until(lambda: proxy.held_responses() > 0, timeout=10), \
            f"no answer to hold before kill {k}: nothing in flight"
        seen.append(stored_count(broker.port, topic))
        broker.kill()
        proxy.drop_held()  # the dead broker's answers never arrive
        broker.start()
        proxy.hold_responses(False)
    return seen


def confluent_reports(bootstrap: str, topic: str, values: list[bytes], running: threading.Event,
                      out: list[Report]) -> None:
    from confluent_kafka import Producer
    reports: dict[bytes, Report] = {}
    on_delivery = confluent_reporter(reports)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "max.in.flight.requests.per.connection": 5, "linger.ms": 5,
                         "batch.num.messages": SMALL_BATCH_RECORDS,
                         "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000, "retry.backoff.ms": 50,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
    try:
        for i, value in enumerate(values):
            produce_when_room(producer, topic, key=b"k%d" % i, value=value, on_delivery=on_delivery)
        producer.flush(DELIVERY_TIMEOUT_S + 10)
        out.extend(reports.get(v) or Report(v, None, None, "NoReport") for v in values)
    finally:
        running.clear()


def java_reports(bootstrap: str, topic: str, values: list[bytes], running: threading.Event,
                 out: list[Report]) -> None:
    try:
        deliveries = java_produce(bootstrap, topic, len(values), idempotence=True, max_in_flight=5,
                                  key_prefix="k", value_prefix=values[0].decode().rsplit("-", 1)[0] + "-",
                                  extra_props={"batch.size": SMALL_BATCH_BYTES, "retry.backoff.ms": 50,
                                               "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500},
                                  timeout=STREAM_TIMEOUT_S)
        out.extend(Report(d.value.encode(), d.partition, d.offset if d.ok else None, d.error) for d in deliveries)
    finally:
        running.clear()


@pytest.mark.parametrize("client", ["confluent", pytest.param("java", marks=pytest.mark.slow)])  # java: over 20 s
def test_idempotent_stream_survives_three_kill_9_exactly_once_in_order(broker_factory, client):
    if client == "java" and not java_available():
        pytest.skip(java_unavailable_reason())
    check, stats = _crash_run(broker_factory, client, dedup=True)
    assert check.lost == 0 and check.foreign == 0, check.summary()
    assert check.duplicated == 0, check.summary()
    assert check.out_of_order == 0 and check.holes == 0, check.summary()
    assert check.offset_mismatches == 0, check.summary()
    assert check.unknown_offsets == 0 or stats.produce_errors.get(ErrorCode.DUPLICATE_SEQUENCE_NUMBER), check.summary()
    assert check.failed == 0 and check.stored == COUNT, check.summary()


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_control_with_broker_dedup_disabled_the_kills_store_duplicates(broker_factory):
    """The same run with the broker's deduplication off: batches written just before a kill are stored again
    when the client retries them, so the run above is free of duplicates because of dedup, not by luck."""
    check, _ = _crash_run(broker_factory, "confluent", dedup=False)
    assert check.lost == 0, check.summary()
    assert check.duplicated > 0, f"three kills did not cause a single duplicate: {check.summary()}"


def _crash_run(broker_factory, client: str, dedup: bool):
    with FaultProxy() as proxy:
        broker = broker_factory({"advertised.port": str(proxy.port), "brokerDeduplicationEnabled": str(dedup).lower()})
        proxy.upstream_port = broker.port
        topic = f"crash-{client}"
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
        values = stream_values(topic, COUNT)
        reports: list[Report] = []
        running = threading.Event()
        running.set()
        produce = confluent_reports if client == "confluent" else java_reports
        thread = threading.Thread(target=produce, args=(proxy.bootstrap, topic, values, running, reports),
                                  daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            at_kills = kill_three_times_while(broker, proxy, topic, COUNT, running)
        finally:
            thread.join(STREAM_TIMEOUT_S + 30)
        assert not thread.is_alive(), "the producer did not finish"
        check = check_stream(values, reports, read_topic(broker.port, topic, range(PARTITIONS)))
        stats = proxy.stats()
    print(f"\n[{client} dedup={dedup} kill -9 x{KILLS}] stored at kills={at_kills} "
          f"elapsed={time.monotonic() - started:.1f}s connections={stats.connections} "
          f"produce_errors={stats.produce_errors} {check.summary()}")
    assert stats.order_violations == 0, "the broker answered out of request order"
    assert len(reports) == COUNT
    return check, stats
