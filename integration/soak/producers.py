"""Idempotent producers, one thread per client library, each writing a numbered stream to a topic of its own until
told to stop; every value gets a Report (acknowledged offset, or the delivery error)."""
from __future__ import annotations

import abc
import asyncio
import threading
import time

from integration.idem_stream import Report, confluent_reporter, produce_when_room
from integration.java_client import java_available, java_produce

DELIVERY_TIMEOUT_S = 300  # longer than any fault the schedule plans: a retriable error is retried, never given up
RATE_PER_S = 200


class StreamProducer(threading.Thread, abc.ABC):
    """Produces f"{name}-{i}" (key str(i)) to `topic` at about `rate` a second until stop() is called; `name` is
    the client's unless given (two producers of one client writing to one topic, in two clusters)."""

    client = ""

    def __init__(self, bootstrap: str, topic: str, name: str = "", rate: float = RATE_PER_S) -> None:
        self.name_prefix = name or self.client
        super().__init__(name=f"producer-{self.name_prefix}", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.rate = rate
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

    def numbered(self):
        """(i, value) of the next value to send, unpaced, until stop() is called; each is recorded as sent."""
        i = 0
        while not self._stop_asked.is_set():
            value = f"{self.name_prefix}-{i}".encode()
            self.sent.append(value)
            yield i, value
            i += 1

    def values(self):
        """numbered(), paced at self.rate."""
        for i, value in self.numbered():
            yield i, value
            time.sleep(1 / self.rate)

    def owns(self, value: bytes | None) -> bool:
        """Whether a stored value is one of this producer's (another may write to the same topic)."""
        return value is not None and value.startswith(f"{self.name_prefix}-".encode())

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
        from kafka.errors import KafkaTimeoutError
        try:
            futures = [producer.send(self.topic, key=str(i).encode(), value=value) for i, value in self.values()]
            try:
                producer.flush(DELIVERY_TIMEOUT_S + 10)
            except KafkaTimeoutError as exc:
                self.error = exc  # records still unsent: reported, and each one's report says so
            out = []
            for value, future in zip(self.sent, futures):
                if not future.is_done:
                    out.append(Report(value, None, None, "NotDelivered"))
                    continue
                try:
                    md = future.get(timeout=1)
                    out.append(Report(value, md.partition, md.offset if md.offset >= 0 else None, None))
                except Exception as exc:  # noqa: BLE001 - a failed delivery, counted by the checker
                    out.append(Report(value, None, None, type(exc).__name__))
            return out
        finally:
            try:
                producer.close(timeout=10)
            except KafkaTimeoutError:
                pass  # close() flushes again: what it could not send is reported already


class AiokafkaProducer(StreamProducer):
    client = "aiokafka"

    def produce(self) -> list[Report]:
        return asyncio.run(self._produce())

    async def _produce(self) -> list[Report]:
        from aiokafka import AIOKafkaProducer
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all",
                                    linger_ms=5, request_timeout_ms=5000, retry_backoff_ms=50)
        await producer.start()
        futures = []
        try:
            for i, value in self.numbered():
                futures.append(await _send_when_room(producer, self.topic, key=str(i).encode(), value=value))
                await asyncio.sleep(1 / self.rate)  # paced without holding up the client's own tasks
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True),
                                             DELIVERY_TIMEOUT_S + 10)
        finally:
            await asyncio.wait_for(producer.stop(), 30)
        return [Report(v, None, None, type(md).__name__) if isinstance(md, BaseException)
                else Report(v, md.partition, md.offset if md.offset >= 0 else None, None)
                for v, md in zip(self.sent, results)]


async def _send_when_room(producer, topic: str, **fields):
    """aiokafka's send(), again while it gives up (KafkaTimeoutError after request_timeout_ms) because its batches
    stay full through a fault; the record was not queued then."""
    from aiokafka.errors import KafkaTimeoutError
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while True:
        try:
            return await producer.send(topic, **fields)
        except KafkaTimeoutError:
            if time.monotonic() > deadline:
                raise


class JavaProducer(StreamProducer):
    """The Java client sends a fixed count per process: one run per JAVA_CHUNK values, numbered on from the last."""

    client = "java"

    def produce(self) -> list[Report]:
        reports: list[Report] = []
        start = 0
        while not self._stop_asked.is_set():
            values = [f"{self.name_prefix}-{i}".encode() for i in range(start, start + JAVA_CHUNK)]
            self.sent.extend(values)
            deliveries = java_produce(self.bootstrap, self.topic, JAVA_CHUNK, key_prefix="", start_index=start,
                                      value_prefix=f"{self.name_prefix}-", timeout=DELIVERY_TIMEOUT_S + 30,
                                      extra_props={"retry.backoff.ms": 50, "reconnect.backoff.ms": 50,
                                                   "reconnect.backoff.max.ms": 500})
            by_value = {d.value.encode(): d for d in deliveries}
            reports += [Report(v, by_value[v].partition, by_value[v].offset if by_value[v].ok else None,
                               by_value[v].error) for v in values]
            start += JAVA_CHUNK
            self._stop_asked.wait(JAVA_CHUNK / self.rate / 2)  # about the others' pace, counting the JVM's start
        return reports


JAVA_CHUNK = 400
_ALL = (ConfluentProducer, KafkaPythonProducer, AiokafkaProducer) + ((JavaProducer,) if java_available() else ())
PRODUCERS: dict[str, type[StreamProducer]] = {p.client: p for p in _ALL}
