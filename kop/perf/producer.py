"""The produce loop: send pre-built records as fast as allowed and time each one from produce() to its ack.

Latency is librdkafka's `Message.latency()`, read in the delivery callback: its own monotonic clock from produce() to
that moment. Callbacks run only inside poll(), so the loop polls after every small chunk of sends and, when pacing,
waits inside poll() rather than sleeping, so no ack waits long for the tool to notice it.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer

from kop.perf.cluster import CONNECT_TIMEOUT_S, client_config, reason
from kop.perf.display import Display
from kop.perf.options import PerfError, ProduceOptions
from kop.perf.sampler import Sampler
from kop.perf.stats import Recorder, Sample, Totals

PRODUCER_NAME_HEADER = "kop.producer.name"
SEQUENCE_ID_HEADER = "kop.sequence.id"
CHUNK = 64  # sends between two polls when unpaced: ~100 us of work, so acks are served promptly
PAYLOAD_POOL = 64  # distinct values, so compression sees varied input ...
PAYLOAD_POOL_BYTES = 16 << 20  # ... within this much memory


@dataclass(frozen=True)
class ProduceResult:
    samples: list[Sample]
    totals: Totals  # acknowledged records, from the first send to the last ack
    sent: int  # handed to the client (records a Ctrl-C stopped before they left are not counted)
    failed: int
    first_error: str | None
    interrupted: bool


def payloads(record_size: int, seed: int = 42) -> list[bytes]:
    """Random upper-case letters, as kafka-producer-perf-test sends: compressible about as much as text."""
    rng = random.Random(seed)
    count = max(1, min(PAYLOAD_POOL, PAYLOAD_POOL_BYTES // record_size))
    letters = bytes(range(ord("A"), ord("Z") + 1))
    return [bytes(rng.choices(letters, k=record_size)) for _ in range(count)]


class _Outcomes:
    """The delivery callback's state: latencies go to the recorder, failures are counted here."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None
        self.failed = 0
        self.purged = 0  # dropped from the queue by a Ctrl-C, never sent
        self.first_error: str | None = None

    def on_delivery(self, err: KafkaError | None, msg) -> None:
        if err is None:
            self.recorder.latencies.append(msg.latency())
            self.recorder.bytes += len(msg)
        elif err.code() == KafkaError._PURGE_QUEUE:
            self.purged += 1
        else:
            self.failed += 1
            self.first_error = self.first_error or err.str()


def _sender(producer: Producer, options: ProduceOptions) -> Callable[[int], None]:
    """send(i) produces record i; the variants are separate so the common one tests nothing per record."""
    produce, topic, values = producer.produce, options.topic, payloads(options.record_size)
    count = len(values)
    if options.sequence_headers is None:
        return lambda i: produce(topic, values[i % count])
    name, first = options.sequence_headers.encode(), options.sequence_start
    return lambda i: produce(topic, values[i % count],
                             headers=[(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, b"%d" % (first + i))])


def _start_producer(options: ProduceOptions, outcomes: _Outcomes) -> Producer:
    try:
        producer = Producer(client_config(options.bootstrap_server,
                                          {**options.client_config, "on_delivery": outcomes.on_delivery}))
    except KafkaException as exc:
        raise PerfError(f"producer settings: {reason(exc)}") from None
    if options.transactional_id:
        try:
            producer.init_transactions(CONNECT_TIMEOUT_S)
            producer.begin_transaction()
        except KafkaException as exc:
            raise PerfError(f"transactional id {options.transactional_id!r}: {reason(exc)}") from None
    # Metadata and the connections to the partition leaders before the clock starts.
    producer.list_topics(options.topic, timeout=CONNECT_TIMEOUT_S)
    return producer


def run_produce(options: ProduceOptions, display: Display) -> ProduceResult:
    outcomes = _Outcomes()
    producer = _start_producer(options, outcomes)
    send, poll = _sender(producer, options), producer.poll
    limit = options.num_records or math.inf
    sampler = Sampler(latency_unit_us=1e6, duration_s=options.duration_s, report=display.sample)
    start = sampler.start
    outcomes.recorder = sampler.recorder
    commit_every = options.transaction_duration_ms / 1000
    next_commit = start + commit_every if options.transactional_id else math.inf
    sent, interrupted = 0, False
    try:
        while sent < limit:
            now = time.monotonic()
            if sampler.ended(now):
                break
            if now >= next_commit:
                _commit(producer, options)
                next_commit = now + commit_every
            if options.paced:
                due = min(limit, math.floor((now - start) * options.throughput) + 1)
                if sent >= due:  # ahead of the pace: wait in poll(), serving acks, until the next record is due
                    poll(max(0.0, min(start + sent / options.throughput, sampler.next_tick, sampler.end) - now))
                    continue
            else:
                due = min(limit, sent + CHUNK)
            while sent < due:
                try:
                    send(sent)
                except BufferError:  # the client's queue is full: serve acks until there is room
                    poll(0.01)
                    break
                sent += 1
            poll(0)
        if options.transactional_id:
            _commit(producer, options)
    except KeyboardInterrupt:
        interrupted = True
        producer.purge(in_queue=True, in_flight=False)  # what has not left will not: stop waiting for it
    _drain(producer, sampler)
    finished = time.monotonic()
    sampler.finish(finished)
    return ProduceResult(sampler.recorder.samples, sampler.recorder.totals(finished - start),
                         sent - outcomes.purged, outcomes.failed, outcomes.first_error, interrupted)


def _drain(producer: Producer, sampler: Sampler) -> None:
    """Serve acks until every sent record has one or failed (librdkafka's message.timeout.ms bounds the wait); a
    second Ctrl-C stops waiting."""
    try:
        while len(producer):
            producer.poll(min(0.1, max(0.0, sampler.next_tick - time.monotonic())))
            sampler.tick_if_due(time.monotonic())
    except KeyboardInterrupt:
        pass


def _commit(producer: Producer, options: ProduceOptions) -> None:
    try:
        producer.commit_transaction()
        producer.begin_transaction()
    except KafkaException as exc:
        raise PerfError(f"transaction of {options.transactional_id!r}: {reason(exc)}") from None
