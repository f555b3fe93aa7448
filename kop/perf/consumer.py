"""The consume loop: read records in batches, and time each one from its timestamp to its arrival.

The latency is the wall clock now minus the record's timestamp (CreateTime, or LogAppendTime if the topic says so):
end-to-end when a producer runs at the same time, and as exact as the two machines' clocks agree. Throughput counts
from the moment partitions were assigned, so joining the group is reported apart (`assigned_after_s`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException

from kop.perf.cluster import client_config, reason
from kop.perf.display import Display
from kop.perf.options import ConsumeOptions, PerfError
from kop.perf.sampler import Sampler
from kop.perf.stats import Sample, Totals

BATCH = 500  # at most this many records per consume() call: one Python call per batch, not per record


@dataclass(frozen=True)
class ConsumeResult:
    samples: list[Sample]
    totals: Totals  # from the partitions' assignment to the last record
    expected: int | None
    assigned_after_s: float | None  # None: never assigned
    timed_out: bool  # --timeout passed without a record
    interrupted: bool


def _start_consumer(options: ConsumeOptions, assigned: list[float]) -> Consumer:
    try:
        consumer = Consumer(client_config(options.bootstrap_server, options.client_config))
    except KafkaException as exc:
        raise PerfError(f"consumer settings: {reason(exc)}") from None

    def on_assign(_consumer, partitions) -> None:
        if partitions and not assigned:
            assigned.append(time.monotonic())

    consumer.subscribe([options.topic], on_assign=on_assign)
    return consumer


def run_consume(options: ConsumeOptions, display: Display) -> ConsumeResult:
    assigned: list[float] = []
    consumer = _start_consumer(options, assigned)
    limit = options.messages or math.inf
    sampler = Sampler(latency_unit_us=1000, duration_s=options.duration_s, report=display.sample)
    recorder, start = sampler.recorder, sampler.start
    latencies = recorder.latencies.append
    received, last_record_at, timed_out, interrupted = 0, start, False, False
    try:
        while received < limit:
            now = time.monotonic()
            if sampler.ended(now):
                break
            if now - last_record_at >= options.idle_timeout_s:
                timed_out = True
                break
            # consume() with a timeout waits for a full batch, which would add the wait to every latency: take
            # what is already there, and only when nothing is, wait in poll(), which returns with the first record.
            batch = consumer.consume(int(min(BATCH, limit - received)), timeout=0)
            if not batch:
                wake = min(sampler.next_tick, sampler.end, last_record_at + options.idle_timeout_s)
                first = consumer.poll(max(0.0, wake - now))
                if first is None:
                    continue
                batch = [first]
            arrived_ms = time.time() * 1000
            for record in batch:
                error = record.error()
                if error is not None:
                    _on_error(error, display)
                    continue
                kind, timestamp_ms = record.timestamp()
                latencies(math.nan if kind == TIMESTAMP_NOT_AVAILABLE else arrived_ms - timestamp_ms)
                recorder.bytes += len(record)
            if recorder.records + len(recorder.latencies) > received:  # not a batch of errors only
                received = recorder.records + len(recorder.latencies)
                last_record_at = time.monotonic()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        consumer.close()  # leaves the group at once, committing the offsets consumed
    sampler.finish(time.monotonic())
    begin = assigned[0] if assigned else start
    return ConsumeResult(recorder.samples, recorder.totals(max(0.0, last_record_at - begin)), options.messages,
                         assigned[0] - start if assigned else None, timed_out, interrupted)


def _on_error(error: KafkaError, display: Display) -> None:
    """A fatal error or a missing topic ends the run; others (a broker restarting) are shown and waited out."""
    if error.fatal() or error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                         KafkaError.GROUP_AUTHORIZATION_FAILED):
        raise PerfError(f"consuming: {error.str()}")
    display.warn(error.str())
