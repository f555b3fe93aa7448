"""A broker of a cluster whose group coordinator shard, transaction coordinator shard and partition another broker
took over behind its back, from a view of the live brokers that was already outdated (or while this one was paused),
and then gave back: the other's take raised their epochs, so every write of this broker is refused. Its next follow
step sees the stored epochs moved, drops them and takes them over again, instead of answering NOT_COORDINATOR and
failing produce requests until the view of the live brokers changes. An in-process broker on a real PostgreSQL, a
second store on the same database standing for the other broker, and the Kafka protocol over TCP."""
import asyncio

import pytest
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from integration.idem_raw import RawKafka, plain_batch
from integration.test_cluster import commit_offset, committed_offset
from kop.broker import Broker
from kop.cluster import groups, transactions
from kop.config import BrokerConfig
from kop.ledger.postgres import PgStore
from protocol.errors import ErrorCode

pytestmark = pytest.mark.timeout(60)
TOPIC, GROUP, TRANSACTIONAL_ID = "taken", "taken-group", "taken-txn"


def init_transactional(port: int) -> int:
    request = InitProducerIdRequest[4](transactional_id=TRANSACTIONAL_ID, transaction_timeout_ms=60_000,
                                       producer_id=-1, producer_epoch=-1)
    with RawKafka(port) as kafka:
        return kafka.call(request, InitProducerIdResponse, 4).error_code


def produce(port: int, value: bytes) -> tuple[int, int]:
    with RawKafka(port) as kafka:
        answer = kafka.produce(TOPIC, 0, plain_batch([value]))
    return answer.error_code, answer.base_offset


async def test_what_another_broker_took_over_from_an_outdated_view_is_taken_again_at_the_next_follow(
        tmp_path, postgres_url):
    # Heartbeats far apart: the follow step runs only when the test calls it.
    broker = Broker(BrokerConfig(port=0, admin_port=0, fsync=False, data_dir=str(tmp_path), storage=postgres_url,
                                 broker_heartbeat_interval_ms=60_000, broker_session_timeout_ms=180_000))
    await broker.start()
    other = await PgStore(postgres_url).open()
    port = broker.port
    try:
        with RawKafka(port) as kafka:
            assert await asyncio.to_thread(kafka.create_topic, TOPIC, 1) == ErrorCode.NONE
        assert await asyncio.to_thread(commit_offset, port, GROUP, TOPIC, 5) == ErrorCode.NONE
        assert await asyncio.to_thread(produce, port, b"first") == (ErrorCode.NONE, 0)
        assert await asyncio.to_thread(init_transactional, port) == ErrorCode.NONE

        # What the other broker's follow step does with a view that gives it these (its load fences this one out).
        for ledger in (groups.shard_ledger(groups.shard_of(GROUP)),
                       transactions.shard_ledger(transactions.shard_of(TRANSACTIONAL_ID)),
                       broker.topics.storage.ledger_key(TOPIC, 0)):
            await other.take_ownership(ledger, 0)
        # The control: this broker is fenced out of all three.
        assert await asyncio.to_thread(commit_offset, port, GROUP, TOPIC, 7) == ErrorCode.NOT_COORDINATOR
        assert (await asyncio.to_thread(produce, port, b"refused"))[0] != ErrorCode.NONE
        assert await asyncio.to_thread(init_transactional, port) != ErrorCode.NONE

        await broker.cluster.follow()  # the view still gives this broker all of them
        assert await asyncio.to_thread(commit_offset, port, GROUP, TOPIC, 9) == ErrorCode.NONE
        assert await asyncio.to_thread(committed_offset, port, GROUP, TOPIC) == (ErrorCode.NONE, 9)
        assert await asyncio.to_thread(produce, port, b"second") == (ErrorCode.NONE, 1)  # the refused one not stored
        assert await asyncio.to_thread(init_transactional, port) == ErrorCode.NONE
    finally:
        await other.close()
        await broker.stop()
