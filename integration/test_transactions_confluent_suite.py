"""confluent-kafka-python's transactional integration scenarios, restated in our own words.

Its `tests/integration/producer/test_transactions.py` runs against trivup's one-broker cluster but is in the
GitHub repository only, not in the PyPI sdist the compat gate fetches, so the scenarios are ported here: commit,
abort, abort then commit with the same producer, and offsets sent to a transaction read back after a second
producer with the same transactional id finished initialising. As there, the tests share one broker and one
transactional id, so each test's producer fences the one before it; consumers subscribe to a one-partition topic
made with the AdminClient and count records until end of partition with librdkafka's default isolation
(read_committed). Unlike there, every test also reads read_uncommitted, which shows the records were written.
"""
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from integration.broker_process import BrokerProcess
from integration.txn_clients import READ_UNCOMMITTED

TRANSACTIONAL_ID = "confluent-suite-txn"  # one id for the whole module, as in the original
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    broker = BrokerProcess(str(tmp_path_factory.mktemp("kop") / "data")).start()
    yield broker.bootstrap
    broker.stop()


def new_topic(bootstrap: str, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the result: its futures die with it
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(TIMEOUT_S)
    return name


def txn_producer(producers: Callable[[dict], Producer], bootstrap: str, client_id: str = "rdkafka") -> Producer:
    """The suite's transactional producer, made by `producers` (the ck_producers fixture: let go when the test
    ends)."""
    producer = producers({"bootstrap.servers": bootstrap, "transactional.id": TRANSACTIONAL_ID,
                         "client.id": client_id})
    producer.init_transactions(TIMEOUT_S)
    return producer


def produce_in_transaction(producer: Producer, topic: str, count: int) -> None:
    """Begin a transaction and put `count` records in it; the caller ends it."""
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, f"record-{i}".encode())
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0


def subscribed_consumer(bootstrap: str, topic: str, **config) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "enable.partition.eof": True, **config})
    consumer.subscribe([topic])
    return consumer


def drain(consumer: Consumer) -> int:
    """Records the consumer gets until every assigned partition reports its end (the group join included)."""
    count, at_end = 0, set()
    deadline = time.monotonic() + TIMEOUT_S
    while not consumer.assignment() or len(at_end) < len(consumer.assignment()):
        assert time.monotonic() < deadline, f"not at the end of {consumer.assignment()} after {TIMEOUT_S}s"
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        key = (msg.topic(), msg.partition())
        if msg.error() is not None:
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            at_end.add(key)
            continue
        at_end.discard(key)
        count += 1
    return count


def count_records(bootstrap: str, topic: str, **config) -> int:
    consumer = subscribed_consumer(bootstrap, topic, **config)
    try:
        return drain(consumer)
    finally:
        consumer.close()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_commit_or_abort(bootstrap, commit, ck_producers):
    topic = new_topic(bootstrap, "commit" if commit else "abort")
    producer = txn_producer(ck_producers, bootstrap)
    produce_in_transaction(producer, topic, 100)
    (producer.commit_transaction if commit else producer.abort_transaction)(TIMEOUT_S)
    # After an abort the partition holds only aborted records and the marker: read_committed still reaches its end.
    assert count_records(bootstrap, topic) == (100 if commit else 0)
    assert count_records(bootstrap, topic, **{"isolation.level": READ_UNCOMMITTED}) == 100


def test_abort_then_commit_with_the_same_producer(bootstrap, ck_producers):
    topic = new_topic(bootstrap, "abort-retry")
    producer = txn_producer(ck_producers, bootstrap)
    produce_in_transaction(producer, topic, 100)
    producer.abort_transaction(TIMEOUT_S)
    produce_in_transaction(producer, topic, 25)
    producer.commit_transaction(TIMEOUT_S)
    assert count_records(bootstrap, topic) == 25
    assert count_records(bootstrap, topic, **{"isolation.level": READ_UNCOMMITTED}) == 125


def test_offsets_sent_to_a_transaction_are_the_groups_after_commit(bootstrap, ck_producers):
    source, target = new_topic(bootstrap, "input"), new_topic(bootstrap, "output")
    seeder = ck_producers({"bootstrap.servers": bootstrap, "linger.ms": 500})
    for i in range(100):
        seeder.produce(source, f"seed-{i}".encode())
    assert seeder.flush(TIMEOUT_S) == 0
    consumer = subscribed_consumer(bootstrap, source)
    try:
        assert drain(consumer) == 100
        producer = txn_producer(ck_producers, bootstrap, "producer1")
        produce_in_transaction(producer, target, 100)
        positions = consumer.position(consumer.assignment())
        assert [tp.offset for tp in positions] == [100]
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)
        # A second producer's init returns once the first one's transaction is complete, offsets included.
        txn_producer(ck_producers, bootstrap, "producer2")
        committed = consumer.committed(consumer.assignment(), TIMEOUT_S)
        assert [tp.offset for tp in committed] == [100]
    finally:
        consumer.close()
    assert count_records(bootstrap, target) == 100
