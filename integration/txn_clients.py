"""Helpers for transaction tests: reading a topic to its end as a read_committed or read_uncommitted consumer,
and the raw transactional requests a test sends when it must control every field."""
import time

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
from kafka.protocol.producer.transaction import (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
                                                 EndTxnResponse)

from integration.idem_raw import RawKafka

READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"


def ck_read_to_end(bootstrap: str, topic: str, partitions=(0,), isolation: str = READ_COMMITTED,
                   timeout: float = 20.0) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record a consumer of this isolation level gets before it reaches the
    end of each partition (the last stable offset for read_committed)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{isolation}",
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
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


def values(records: list[tuple[int, int, bytes]]) -> list[bytes]:
    return [value for _, _, value in records]


class RawTxnProducer:
    """A transactional producer speaking the protocol itself, for the requests clients never send on their own
    (a batch arriving after its transaction ended, a partition never added)."""

    def __init__(self, kafka: RawKafka, transactional_id: str, timeout_ms: int = 60_000) -> None:
        self.kafka = kafka
        self.transactional_id = transactional_id
        answer = kafka.call(InitProducerIdRequest[4](transactional_id=transactional_id,
                                                     transaction_timeout_ms=timeout_ms, producer_id=-1,
                                                     producer_epoch=-1), InitProducerIdResponse, 4)
        assert answer.error_code == 0, answer
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch

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
