"""Helpers for transaction tests: reading a topic to its end as a read_committed or read_uncommitted consumer,
and the raw transactional requests a test sends when it must control every field."""
import logging
import time
from dataclasses import dataclass, field

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
from kafka.protocol.producer.transaction import (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
                                                 EndTxnResponse)

from integration.clients import ck_let_go
from integration.idem_raw import RawKafka
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"


def ck_read_to_end(bootstrap: str, topic: str, partitions=(0,), isolation: str = READ_COMMITTED,
                   timeout: float = 20.0, security: dict | None = None) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record a consumer of this isolation level gets before it reaches the
    end of each partition (the last stable offset for read_committed); security: the client's TLS and SASL."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{isolation}",
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True,
                         **(security or {})})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out, at_end = [], set()
        deadline = time.monotonic() + timeout
        while at_end != set(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {set(partitions) - at_end} not read to the end")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            out.append((msg.partition(), msg.offset(), msg.value()))
        return out
    finally:
        consumer.close()


def ck_open_transaction(bootstrap: str, topic: str, prefix: str, count: int, make=None):
    """A confluent-kafka producer (transactional id f"{topic}-{prefix}") with a transaction open that holds `count`
    stored records f"{prefix}{i}" in partition 0; the caller commits or aborts it. `make`: what makes the producer
    from its config (the ck_producers fixture lets it go when the test ends)."""
    from confluent_kafka import Producer
    producer = (make or Producer)({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-{prefix}"})
    producer.init_transactions(15)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, f"{prefix}{i}".encode(), partition=0)
    assert producer.flush(15) == 0
    return producer


def values(records: list[tuple[int, int, bytes]]) -> list[bytes]:
    return [value for _, _, value in records]


def init_transactional_id(kafka: RawKafka, transactional_id: str, timeout_ms: int = 60_000, producer_id: int = -1,
                          producer_epoch: int = -1) -> tuple[int, int, int]:
    """InitProducerId v4 for a transactional id: (error code, producer id, epoch) as answered."""
    answer = kafka.call(InitProducerIdRequest[4](transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
                                                 producer_id=producer_id, producer_epoch=producer_epoch),
                        InitProducerIdResponse, 4)
    return answer.error_code, answer.producer_id, answer.producer_epoch


class RawTxnProducer:
    """A transactional producer speaking the protocol itself, for the requests clients never send on their own
    (a batch arriving after its transaction ended, a partition never added)."""

    def __init__(self, kafka: RawKafka, transactional_id: str, timeout_ms: int = 60_000,
                 identity: tuple[int, int] | None = None) -> None:
        """InitProducerId for `transactional_id`, or a producer of an `identity` (producer id, epoch) handed out
        before, which sends no InitProducerId."""
        self.kafka = kafka
        self.transactional_id = transactional_id
        if identity is None:
            error, *identity = init_transactional_id(kafka, transactional_id, timeout_ms)
            assert error == ErrorCode.NONE, (transactional_id, error)
        self.producer_id, self.epoch = identity

    def over(self, kafka: RawKafka) -> "RawTxnProducer":
        """The same producer (id and epoch) on another connection, for a request sent while one is in flight."""
        return RawTxnProducer(kafka, self.transactional_id, identity=(self.producer_id, self.epoch))

    def add_partitions(self, topic: str, partitions: list[int], version: int = 3) -> dict[int, int]:
        request = AddPartitionsToTxnRequest[version](
            v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic,
                                                                                  partitions=partitions)])
        response = self.kafka.call(request, AddPartitionsToTxnResponse, version)
        return {p.partition_index: p.partition_error_code
                for t in response.results_by_topic_v3_and_below for p in t.results_by_partition}

    def end(self, commit: bool, version: int = 3, epoch: int | None = None) -> int:
        request = EndTxnRequest[version](transactional_id=self.transactional_id, producer_id=self.producer_id,
                                         producer_epoch=self.epoch if epoch is None else epoch, committed=commit)
        return self.kafka.call(request, EndTxnResponse, version).error_code


# librdkafka 2.10 and later re-bootstrap when every broker they know is down, which a single restarting broker is;
# their coordinator cache can keep the handle of the broker they decommissioned then, and send_offsets_to_transaction
# waits on it for ever (a librdkafka bug, not fixed in 2.16). Turning re-bootstrap off avoids it.
# Its reconnect backoff also doubles up to 10 s while connections keep dropping; the Java client's ceiling is 1 s.
CK_THROUGH_FAULTS = {"metadata.recovery.strategy": "none", "reconnect.backoff.max.ms": 1000}


@dataclass
class CopySummary:
    copied: int = 0
    transactions: int = 0
    aborts: int = 0
    errors: list[str] = field(default_factory=list)  # the first few abortable errors, for a failing test's message


def ck_copy(bootstrap: str, source: str, target: str, group: str, count: int, batch: int = 50,
            deadline_s: float = 120.0) -> CopySummary:
    """confluent-kafka's consume-transform-produce loop: a read_committed consumer in `group` reads `source` from the
    group's committed offsets; every `batch` records go to `target` as b"out-" + value, same partition, in one
    transaction with the consumed offsets, until `count` records are copied or the deadline passes. A transaction
    that fails (kop killed, an answer lost) is aborted and the consumer goes back to the group's committed offsets."""
    from confluent_kafka import Consumer, KafkaException, Producer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": READ_COMMITTED, "auto.offset.reset": "earliest", **CK_THROUGH_FAULTS})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{group}-copier", "linger.ms": 5,
                         **CK_THROUGH_FAULTS})
    summary = CopySummary()
    deadline = time.monotonic() + deadline_s
    try:
        producer.init_transactions(30)
        consumer.subscribe([source])
        while summary.copied < count and time.monotonic() < deadline:
            polled = [m for m in consumer.consume(batch, 0.5) if m.error() is None]
            if not polled:
                continue
            try:
                producer.begin_transaction()
                for message in polled:
                    producer.produce(target, b"out-" + message.value(), partition=message.partition())
                producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                     consumer.consumer_group_metadata(), 30)
                ck_commit(producer)
            except KafkaException as failed:
                error = failed.args[0]
                if error.fatal():
                    raise
                summary.aborts += 1
                if len(summary.errors) < 5:
                    summary.errors.append(str(error))
                ck_abort(producer)
                _ck_rewind(consumer)
                continue
            summary.transactions += 1
            summary.copied += len(polled)
        return summary
    finally:
        consumer.close()
        ck_let_go(producer)


def ck_commit(producer) -> None:
    """Commit, retrying while the outcome is retriable (librdkafka's contract); an abortable error propagates."""
    _ck_retry(lambda: producer.commit_transaction(30), again=lambda error: error.retriable())


def ck_abort(producer) -> None:
    _ck_retry(lambda: producer.abort_transaction(30), again=lambda error: not error.fatal())


def _ck_retry(call, again, attempts: int = 10) -> None:
    """call() until it succeeds; a KafkaError that `again` does not accept, or the last attempt's, propagates."""
    from confluent_kafka import KafkaException
    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as failed:
            if not again(failed.args[0]) or attempt == attempts - 1:
                raise
            log.warning("transactional call failed (attempt %d of %d), again: %s", attempt + 1, attempts,
                        failed.args[0])
            time.sleep(0.2)


def _ck_rewind(consumer) -> None:
    """Back to what the group has committed: the offsets of the transactions that did commit."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
    for attempt in range(10):
        try:
            for committed in consumer.committed(consumer.assignment(), timeout=10):
                offset = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
                consumer.seek(TopicPartition(committed.topic, committed.partition, offset))
            return
        except KafkaException:
            if attempt == 9:
                raise
            time.sleep(0.5)


def two_partition_topics_with_input(port: int, bootstrap: str, source: str, target: str, count: int) -> None:
    """Input and output topics of two partitions each; the input holds `count` records, value i in partition i % 2."""
    from confluent_kafka import Producer
    with RawKafka(port) as kafka:
        for topic in (source, target):
            assert kafka.create_topic(topic, partitions=2) == ErrorCode.NONE
    seed = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(count):
        seed.produce(source, b"%d" % i, partition=i % 2)
    assert seed.flush(60) == 0


def assert_each_input_copied_once(out: list[tuple[int, int, bytes]], count: int) -> None:
    """The output read read_committed: every input exactly once, in order, in its input's partition."""
    for partition in (0, 1):
        got = [value for p, _, value in out if p == partition]
        expected = [b"out-%d" % i for i in range(partition, count, 2)]
        if got != expected:
            missing, extra = len(set(expected) - set(got)), len(got) - len(set(got))
            raise AssertionError(f"partition {partition}: {len(got)} records, expected {len(expected)}; "
                                 f"{missing} missing, {extra} duplicated")
