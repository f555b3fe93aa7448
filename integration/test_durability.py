"""Acknowledged records survive SIGTERM and kill -9 with their offsets, and the broker takes new writes after."""
import threading
import time

import pytest

from integration.clients import ck_consume_all, ck_produce, kp_consume_all


def test_restart_keeps_records_and_offsets(broker):
    records = [(None, f"r{i}".encode(), [], 1_700_000_000_000 + i) for i in range(50)]
    reports = ck_produce(broker.bootstrap, "durable", records, **{"acks": "all"})
    offsets = {value: offset for _, _, offset, value in reports}
    broker.restart()
    got = kp_consume_all(broker.bootstrap, "durable", 50)
    assert {r.value: r.offset for r in got} == offsets
    ck_produce(broker.bootstrap, "durable", [(None, b"after", [], 1_700_000_001_000)])
    got = kp_consume_all(broker.bootstrap, "durable", 51)
    assert got[-1].value == b"after" and got[-1].offset == 50


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_kill_9_during_a_produce_stream_loses_no_acknowledged_record(broker):
    from confluent_kafka import Producer
    acked: dict[bytes, int] = {}
    stop = threading.Event()

    def produce_stream():
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2,
                             "message.timeout.ms": 10000, "retries": 0})

        def on_delivery(err, msg):
            if err is None:
                acked[msg.value()] = msg.offset()
        i = 0
        while not stop.is_set() and i < 200_000:
            try:
                producer.produce("crash", value=f"m{i}".encode(), partition=0, on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            producer.poll(0.001)
        producer.flush(15)

    thread = threading.Thread(target=produce_stream)
    thread.start()
    deadline = time.monotonic() + 30
    while len(acked) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    broker.kill()
    stop.set()
    thread.join(30)
    assert len(acked) >= 2000, "the stream did not get going"
    snapshot = dict(acked)
    broker.start()
    got = ck_consume_all(broker.bootstrap, "crash", len(snapshot), timeout=60)
    stored = {r.value: r.offset for r in got}
    missing = [v for v in snapshot if v not in stored]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:3]}"
    assert all(stored[v] == off for v, off in snapshot.items())
    assert [r.offset for r in got] == list(range(len(got)))
    reports = ck_produce(broker.bootstrap, "crash", [(None, b"after-crash", [], 1_700_000_000_000)])
    assert reports[0][0] is None and reports[0][2] >= len(snapshot)
