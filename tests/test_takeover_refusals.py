"""A broker taking a partition over answers NOT_LEADER_OR_FOLLOWER until it has opened it. A batch pipelined behind
one so refused, arriving once the partition is open, must get the same retriable answer, not
OUT_OF_ORDER_SEQUENCE_NUMBER: librdkafka answers that by bumping its epoch and resending, under the new epoch,
records whose earlier write was stored but never acknowledged. The cluster soak (three brokers on PostgreSQL,
seed 99) stored a confluent-kafka record twice so: once at epoch 0, again at epoch 1 sequence 0."""
import asyncio

import pytest

from integration.idem_raw import RawKafka, idempotent_batch
from kop.broker import Broker
from kop.config import BrokerConfig
from protocol.errors import ErrorCode

pytestmark = pytest.mark.timeout(60)
TOPIC = "taken-over"


async def test_a_batch_behind_one_refused_while_the_partition_was_taken_over_is_not_out_of_order(tmp_path):
    broker = Broker(BrokerConfig(port=0, admin_port=0, fsync=False, data_dir=str(tmp_path)))
    await broker.start()
    kafka = RawKafka(broker.port)
    try:
        assert await asyncio.to_thread(kafka.create_topic, TOPIC, 1) == ErrorCode.NONE
        identity = await asyncio.to_thread(kafka.init_producer_id)
        pid, epoch = identity.producer_id, identity.producer_epoch

        def produce(values: list[bytes], sequence: int) -> int:
            batch = idempotent_batch(values, producer_id=pid, epoch=epoch, base_sequence=sequence)
            return kafka.produce(TOPIC, 0, batch).error_code

        assert await asyncio.to_thread(produce, [b"a0", b"a1"], 0) == ErrorCode.NONE
        # Taken over: the broker owns the partition (a single broker owns everything) but has not opened it yet.
        topics = broker.topics
        topic = topics.get(TOPIC)
        partition, topic.slots[0] = topic.slots[0], None
        await partition.close()
        assert await asyncio.to_thread(produce, [b"b"], 2) == ErrorCode.NOT_LEADER_OR_FOLLOWER  # the control
        await topics.sync()
        assert topic.partition(0) is not None, "the partition was not opened again"

        # The batch behind the refused one: retriable, so the client resends both in order.
        assert await asyncio.to_thread(produce, [b"c"], 3) == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert await asyncio.to_thread(produce, [b"b"], 2) == ErrorCode.NONE
        assert await asyncio.to_thread(produce, [b"c"], 3) == ErrorCode.NONE
        stored = await asyncio.to_thread(kafka.read_partition, TOPIC, 0)
        assert [r.value for r in stored] == [b"a0", b"a1", b"b", b"c"]
    finally:
        kafka.close()
        await broker.stop()
