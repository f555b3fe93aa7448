"""A stream whose records carry application-chosen sequence ids, through kill -9 of the broker and through dropped
connections, from a producer without idempotence (so Kafka's own deduplication cannot help): every record is stored
once, none is lost. The controls, the same streams without the headers, store the retried batches twice.

The producer keeps one request in flight: without idempotence a client with several can reorder records when it
retries, and a record arriving after a higher id of its name is taken for a duplicate (README: the ordering hazard).
"""
import threading

import pytest

from integration.fault_proxy import CutPolicy, FaultProxy
from integration.idem_raw import RawKafka, read_topic
from integration.idem_stream import (DELIVERY_TIMEOUT_S, Report, check_stream, confluent_reporter, produce_when_room,
                                     stream_values)
from integration.test_idempotence_crash import PARTITIONS, STREAM_TIMEOUT_S, kill_three_times_while
from protocol.errors import ErrorCode

COUNT = 20_000


def produce_stream(bootstrap: str, topic: str, values: list[bytes], sequence_ids: bool,
                   running: threading.Event, out: list[Report]) -> None:
    """confluent-kafka without idempotence, one request in flight, retrying; value i is id i of name "stream/{p}"
    for its partition p (names and ids deterministic, as a replayable source's)."""
    from confluent_kafka import Producer
    reports: dict[bytes, Report] = {}
    on_delivery = confluent_reporter(reports)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                         "max.in.flight.requests.per.connection": 1, "retries": 1_000_000, "linger.ms": 5,
                         "batch.num.messages": 50, "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000,
                         "retry.backoff.ms": 50, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
    try:
        for i, value in enumerate(values):
            partition = i % PARTITIONS
            headers = [("kop.producer.name", b"stream/%d" % partition), ("kop.sequence.id", b"%d" % i)]
            produce_when_room(producer, topic, value=value, partition=partition, on_delivery=on_delivery,
                              headers=headers if sequence_ids else None)
        producer.flush(DELIVERY_TIMEOUT_S + 10)
        out.extend(reports.get(v) or Report(v, None, None, "NoReport") for v in values)
    finally:
        running.clear()


def run_stream(proxy: FaultProxy, broker, topic: str, sequence_ids: bool, fault) -> tuple:
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    values = stream_values(topic, COUNT)
    reports: list[Report] = []
    running = threading.Event()
    running.set()
    thread = threading.Thread(target=produce_stream, daemon=True,
                              args=(proxy.bootstrap, topic, values, sequence_ids, running, reports))
    thread.start()
    try:
        fault(running)
    finally:
        thread.join(STREAM_TIMEOUT_S + 30)
    assert not thread.is_alive(), "the producer did not finish"
    return check_stream(values, reports, read_topic(broker.port, topic, range(PARTITIONS))), proxy.stats()


@pytest.mark.slow  # each over 15 s, 27 s in a loaded make test
@pytest.mark.parametrize("sequence_ids", [True, False], ids=["with-sequence-ids", "control-without"])
def test_kill_9_three_times_during_a_stream_with_sequence_ids(broker_factory, sequence_ids):
    with FaultProxy() as proxy:
        broker = broker_factory({"advertised.port": str(proxy.port)})
        proxy.upstream_port = broker.port
        topic = f"killed-{sequence_ids}"
        check, _ = run_stream(proxy, broker, topic, sequence_ids,
                              lambda running: kill_three_times_while(broker, proxy, topic, COUNT, running))
    assert check.failed == 0 and check.lost == 0, check.summary()
    if sequence_ids:
        assert check.duplicated == 0 and check.out_of_order == 0, check.summary()
    else:
        assert check.duplicated > 0, f"the kills caused no duplicate to drop: {check.summary()}"


@pytest.mark.parametrize("sequence_ids", [True, False], ids=["with-sequence-ids", "control-without"])
def test_dropped_connections_during_a_stream_with_sequence_ids(broker_factory, sequence_ids):
    with FaultProxy(policy=CutPolicy(every=15, max_cuts=12)) as proxy:
        broker = broker_factory({"advertised.port": str(proxy.port)})
        proxy.upstream_port = broker.port
        check, stats = run_stream(proxy, broker, f"cut-{sequence_ids}", sequence_ids, lambda running: None)
    assert stats.cuts > 0
    assert check.failed == 0 and check.lost == 0, check.summary()
    if sequence_ids:
        assert check.duplicated == 0 and check.out_of_order == 0, check.summary()
    else:
        assert check.duplicated > 0, f"the cuts caused no duplicate to drop: {check.summary()}"
