"""Idempotent producers, one thread per client library, each writing a numbered stream to a topic of its own until
told to stop; every value gets a Report (acknowledged offset, or the delivery error)."""
from __future__ import annotations

import abc
import threading
import time

from integration.idem_stream import Report, confluent_reporter, produce_when_room

DELIVERY_TIMEOUT_S = 300  # longer than any fault the schedule plans: a retriable error is retried, never given up
RATE_PER_S = 200


class StreamProducer(threading.Thread, abc.ABC):
    """Produces f"{client}-{i}" (key str(i)) to `topic` at about RATE_PER_S until stop() is called."""

    client = ""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name=f"producer-{self.client}", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.sent: list[bytes] = []
        self.reports: list[Report] = []
        self.error: BaseException | None = None
        self._stop_asked = threading.Event()

    def stop(self) -> None:
        self._stop_asked.set()

    def run(self) -> None:
        try:
            self.reports = self.produce()
        except BaseException as exc:  # noqa: BLE001 - reported by the checker, not lost in a thread
            self.error = exc

    def values(self):
        """The next value to send, paced, until stop() is called."""
        i = 0
        while not self._stop_asked.is_set():
            value = f"{self.client}-{i}".encode()
            self.sent.append(value)
            yield i, value
            i += 1
            time.sleep(1 / RATE_PER_S)

    @abc.abstractmethod
    def produce(self) -> list[Report]:
        """Produce self.values() with this client library; a Report per value sent."""


class ConfluentProducer(StreamProducer):
    client = "confluent"

    def produce(self) -> list[Report]:
        from confluent_kafka import Producer
        reports: dict[bytes, Report] = {}
        on_delivery = confluent_reporter(reports)
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000,
                             "request.timeout.ms": 5000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 500,
                             "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
        for i, value in self.values():
            produce_when_room(producer, self.topic, key=str(i).encode(), value=value, on_delivery=on_delivery)
        producer.flush(DELIVERY_TIMEOUT_S + 10)
        return [reports.get(v) or Report(v, None, None, "NoReport") for v in self.sent]


class KafkaPythonProducer(StreamProducer):
    client = "kafka-python"

    def produce(self) -> list[Report]:
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all", linger_ms=5,
                                 request_timeout_ms=5000, delivery_timeout_ms=DELIVERY_TIMEOUT_S * 1000,
                                 retry_backoff_ms=50, reconnect_backoff_ms=50, reconnect_backoff_max_ms=500)
        try:
            futures = [producer.send(self.topic, key=str(i).encode(), value=value) for i, value in self.values()]
            producer.flush(DELIVERY_TIMEOUT_S + 10)
            out = []
            for value, future in zip(self.sent, futures):
                try:
                    md = future.get(timeout=1)
                    out.append(Report(value, md.partition, md.offset if md.offset >= 0 else None, None))
                except Exception as exc:  # noqa: BLE001 - a failed delivery, counted by the checker
                    out.append(Report(value, None, None, type(exc).__name__))
            return out
        finally:
            producer.close(timeout=10)


PRODUCERS: dict[str, type[StreamProducer]] = {p.client: p for p in (ConfluentProducer, KafkaPythonProducer)}
