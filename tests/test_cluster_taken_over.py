"""What a broker of a cluster holds after another broker took it over behind its back.

- A group coordinator shard, a transaction coordinator shard and a partition taken over from a view of the live
  brokers that was already outdated (or while this one was paused), and given back: the other's take raised their
  epochs, so every write of this broker is refused. Its next follow step sees the stored epochs moved, drops them and
  takes them over again, instead of answering NOT_COORDINATOR and failing produce requests until the live brokers
  change.
- A broker whose lease ran out registers again, under a view that gives it its partitions again at once: it answers
  no read from what it held until its follow step has dropped that.

An in-process broker on a real PostgreSQL, a second store on the same database standing for the other broker, and the
Kafka protocol over TCP."""
import asyncio

import pytest
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from integration.idem_raw import RawKafka, plain_batch
from integration.test_cluster import commit_offset, committed_offset
from kop.broker import Broker
from kop.cluster import groups, transactions
from kop.cluster.ownership import owner_of
from kop.config import BrokerConfig
from kop.ledger.postgres import PgStore
from kop.topic_storage import ledger_name
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


@pytest.fixture
async def broker(tmp_path, postgres_url):
    # Heartbeats far apart: the renewal and the follow step run only when the test calls them.
    started = Broker(BrokerConfig(port=0, admin_port=0, fsync=False, data_dir=str(tmp_path), storage=postgres_url,
                                  broker_heartbeat_interval_ms=60_000, broker_session_timeout_ms=180_000))
    await started.start()
    yield started
    await started.stop()


@pytest.fixture
async def other(postgres_url):
    """The store of another broker on the same database."""
    store = await PgStore(postgres_url).open()
    yield store
    await store.close()


async def create_topic(port: int) -> None:
    with RawKafka(port) as kafka:
        assert await asyncio.to_thread(kafka.create_topic, TOPIC, 1) == ErrorCode.NONE


async def test_what_another_broker_took_over_from_an_outdated_view_is_taken_again_at_the_next_follow(broker, other):
    port = broker.port
    await create_topic(port)
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
    with RawKafka(port) as kafka:  # a retriable answer, as Kafka gives for a partition that moved
        assert await asyncio.to_thread(kafka.delete_records, TOPIC, 0, 1) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)

    await broker.cluster.follow()  # the view still gives this broker all of them
    assert await asyncio.to_thread(commit_offset, port, GROUP, TOPIC, 9) == ErrorCode.NONE
    assert await asyncio.to_thread(committed_offset, port, GROUP, TOPIC) == (ErrorCode.NONE, 9)
    assert await asyncio.to_thread(produce, port, b"second") == (ErrorCode.NONE, 1)  # the refused one not stored
    assert await asyncio.to_thread(init_transactional, port) == ErrorCode.NONE


async def test_a_broker_whose_lease_ran_out_reads_nothing_it_held_until_its_follow_step_dropped_it(broker, other):
    """Registered again after its lease ran out (paused past it), the broker's new view gives it its partitions
    again at once; while its follow step is still busy (here: waiting for a table another session locked), it
    answers no read from what it held before: another broker may have written there meanwhile."""
    port = broker.port
    topic = next(t for t in (f"held-{i}" for i in range(100)) if owner_of(ledger_name(t, 0), [1, 2]) == 1)
    with RawKafka(port) as kafka:
        assert await asyncio.to_thread(kafka.create_topic, topic, 1) == ErrorCode.NONE
        assert (await asyncio.to_thread(kafka.produce, topic, 0, plain_batch([b"first"]))).error_code == \
            ErrorCode.NONE
    async with other.pool.acquire() as locker, locker.transaction():
        # Broker 2 registers: the live brokers change, so broker 1's follow step runs at once, and waits for the
        # stored topics, which this session holds locked.
        await locker.execute("LOCK TABLE kop_record IN ACCESS EXCLUSIVE MODE")
        async with other.pool.acquire() as conn:
            await conn.execute("INSERT INTO kop_broker (node_id, session, home, endpoints, lease_until) VALUES "
                               "(2, nextval('kop_broker_session'), 'elsewhere', '{}', "
                               "clock_timestamp() + interval '10 minutes')")
        await broker.cluster.renew()
        async with other.pool.acquire() as conn:  # broker 1's lease runs out, as while it was paused past it
            await conn.execute("UPDATE kop_broker SET lease_until = clock_timestamp() WHERE node_id = 1")
        await other.take_ownership(broker.topics.storage.ledger_key(topic, 0), 0)  # broker 2 takes it meanwhile
        await broker.cluster.renew()  # finds its lease run out and registers again
        # The control: the new view gives broker 1 the partition, which it still holds as before.
        assert broker.cluster.owns(topic, 0) and broker.topics.partition(topic, 0) is not None
        with RawKafka(port) as kafka:
            with pytest.raises(RuntimeError, match=f"failed: {ErrorCode.NOT_LEADER_OR_FOLLOWER.value}$"):
                await asyncio.to_thread(kafka.end_offsets, topic, [0])
            assert (await asyncio.to_thread(kafka.fetch_once, topic, 0, 0))[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
