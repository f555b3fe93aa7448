"""Transactions with kafka-python's and aiokafka's transactional producers and their read_committed and
read_uncommitted consumers: commit, abort, several partitions and topics in one transaction, offsets sent to a
transaction (committed with it, gone with an abort), a zombie fenced by a second producer with the same
transactional id, a transaction aborted by the coordinator past its timeout, and (kafka-python, through the fault
proxy) a Produce request the network delivers after its transaction was aborted."""
import asyncio
import time

import pytest

from integration.fault_proxy import FaultProxy
from integration.idem_raw import RawKafka
from integration.test_transactions import wait_lso
from integration.txn_clients import READ_COMMITTED, READ_UNCOMMITTED, ck_read_to_end, values
from protocol.errors import ErrorCode

SETTLE_S = 1.0  # after the expected records: long enough for an unexpected one to show up
QUICK_TIMEOUTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}  # timed-out aborts in ~1 s
HELD_GIVEN_UP_MS = 10_000  # when kafka-python gives up a batch the network holds (its request and delivery timeouts)
SPREAD = {"a": 3, "b": 2}  # a multi-topic transaction's topics (suffixes) and their partition counts


def create_spread_topics(broker, prefix: str) -> dict[str, int]:
    """The topics of SPREAD under `prefix`: {topic: partition count}."""
    topics = {f"{prefix}-{suffix}": count for suffix, count in SPREAD.items()}
    with RawKafka(broker.port) as kafka:
        for topic, count in topics.items():
            assert kafka.create_topic(topic, partitions=count) == ErrorCode.NONE
    return topics


def spread_records(topics: dict[str, int], tag: str) -> list[tuple[str, int, bytes]]:
    """(topic, partition, value) for one record per partition of every topic: the value names its place."""
    return [(topic, p, f"{tag}-{topic}-{p}".encode()) for topic, count in topics.items() for p in range(count)]


def kp_read(bootstrap: str, topic: str, isolation: str, expected: int, partitions=(0,)) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level=isolation)
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        out = []
        deadline = time.monotonic() + 20
        settle = None
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend(m.value for m in batch)
            if len(out) >= expected and settle is None:
                settle = time.monotonic() + SETTLE_S
        return out
    finally:
        consumer.close()


async def aio_read(bootstrap: str, topic: str, isolation: str, expected: int, partitions=(0,)) -> list[bytes]:
    """aiokafka's consumer of this isolation level from the beginning: `expected` records, then any that come
    within SETTLE_S."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                isolation_level=isolation)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        await consumer.seek_to_beginning()
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(out) < expected and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(m.value for m in batch)
        for batch in (await consumer.getmany(timeout_ms=int(SETTLE_S * 1000))).values():
            out.extend(m.value for m in batch)
        return out
    finally:
        await consumer.stop()


def test_kafka_python_commits_aborts_and_sends_offsets(broker):
    from kafka import KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-txn")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(3):
            producer.send("kp-txn", f"c{i}".encode(), partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(2):
            producer.send("kp-txn", f"a{i}".encode(), partition=0)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("kp-txn", b"o0", partition=0)
        producer.send_offsets_to_transaction({TopicPartition("kp-txn", 0): OffsetAndMetadata(3, "", -1)}, "kp-group")
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)
    assert kp_read(broker.bootstrap, "kp-txn", READ_COMMITTED, 4) == [b"c0", b"c1", b"c2", b"o0"]
    assert kp_read(broker.bootstrap, "kp-txn", READ_UNCOMMITTED, 6) == [b"c0", b"c1", b"c2", b"a0", b"a1", b"o0"]
    assert values(ck_read_to_end(broker.bootstrap, "kp-txn")) == [b"c0", b"c1", b"c2", b"o0"]
    _assert_committed(broker, "kp-group", "kp-txn", 3)


def test_kafka_python_zombie_is_fenced(broker):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError
    zombie = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-fenced")
    successor = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-fenced")
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send("kp-fenced", b"z", partition=0)
        zombie.flush()
        successor.init_transactions()
        with pytest.raises(KafkaError):
            zombie.commit_transaction()
        successor.begin_transaction()
        successor.send("kp-fenced", b"s", partition=0)
        successor.commit_transaction()
    finally:
        zombie.close(timeout=5)
        successor.close(timeout=10)
    assert values(ck_read_to_end(broker.bootstrap, "kp-fenced")) == [b"s"]


def test_aiokafka_commits_aborts_and_sends_offsets(broker):
    from aiokafka import AIOKafkaProducer, TopicPartition

    async def go() -> tuple[list[bytes], list[bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-txn")
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(3):
                    await producer.send_and_wait("aio-txn", f"c{i}".encode(), partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait("aio-txn", b"a0", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait("aio-txn", b"o0", partition=0)
                await producer.send_offsets_to_transaction({TopicPartition("aio-txn", 0): 2}, "aio-group")
        finally:
            await producer.stop()
        return (await aio_read(broker.bootstrap, "aio-txn", READ_COMMITTED, 4),
                await aio_read(broker.bootstrap, "aio-txn", READ_UNCOMMITTED, 5))

    committed, everything = asyncio.run(go())
    assert committed == [b"c0", b"c1", b"c2", b"o0"]
    assert everything == [b"c0", b"c1", b"c2", b"a0", b"o0"]
    _assert_committed(broker, "aio-group", "aio-txn", 2)


def _assert_committed(broker, group: str, topic: str, offset: int) -> None:
    deadline = time.monotonic() + 10
    while (found := _committed_offset(broker, group, topic)) != offset:
        assert time.monotonic() < deadline, f"{group} committed {found} on {topic}-0, expected {offset}"
        time.sleep(0.1)


def test_kafka_python_transaction_spans_partitions_and_topics(broker):
    from kafka import KafkaProducer
    topics = create_spread_topics(broker, "kp-spread")
    aborted, committed = spread_records(topics, "aborted"), spread_records(topics, "committed")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-spread")
    try:
        producer.init_transactions()
        for records, commit in ((aborted, False), (committed, True)):
            producer.begin_transaction()
            for topic, partition, value in records:
                producer.send(topic, value, partition=partition)
            producer.flush()  # stored before the abort: the abort must hide them, not an unsent buffer
            producer.commit_transaction() if commit else producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    for topic, count in topics.items():
        partitions = tuple(range(count))
        mine = lambda records: sorted(value for t, _, value in records if t == topic)
        assert sorted(kp_read(broker.bootstrap, topic, READ_COMMITTED, count, partitions)) == mine(committed)
        assert sorted(kp_read(broker.bootstrap, topic, READ_UNCOMMITTED, 2 * count, partitions)) == \
            sorted(mine(aborted) + mine(committed))


def test_kafka_python_offsets_sent_with_an_aborted_transaction_are_not_committed(broker):
    from kafka import KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-offsets")
    try:
        producer.init_transactions()
        for offset, commit in ((2, True), (5, False)):
            producer.begin_transaction()
            producer.send("kp-offsets", b"%d" % offset, partition=0)
            producer.send_offsets_to_transaction({TopicPartition("kp-offsets", 0): OffsetAndMetadata(offset, "", -1)},
                                                 "kp-offsets-group")
            producer.commit_transaction() if commit else producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    _assert_committed(broker, "kp-offsets-group", "kp-offsets", 2)  # control: the committed transaction's offset
    time.sleep(SETTLE_S)
    assert _committed_offset(broker, "kp-offsets-group", "kp-offsets") == 2  # not the aborted one's 5
    assert values(ck_read_to_end(broker.bootstrap, "kp-offsets")) == [b"2"]


def test_kafka_python_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(broker_factory):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError
    broker = broker_factory(QUICK_TIMEOUTS)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-slow",
                             transaction_timeout_ms=1000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(2):
            producer.send("kp-slow", b"late%d" % i, partition=0)
        producer.flush()
        wait_lso(broker, "kp-slow", 3)  # the coordinator's ABORT marker moved the LSO past the two records
        with pytest.raises(KafkaError) as raised:
            producer.commit_transaction()
        fenced = type(raised.value).__name__
    finally:
        producer.close(timeout=5)
    assert fenced in ("ProducerFencedError", "InvalidProducerEpochError"), fenced
    assert ck_read_to_end(broker.bootstrap, "kp-slow") == []
    assert values(ck_read_to_end(broker.bootstrap, "kp-slow", isolation=READ_UNCOMMITTED)) == [b"late0", b"late1"]


@pytest.mark.slow  # ~17 s: a broker, the client giving the held batch up after 10 s, then two reads
def test_kafka_python_produce_delayed_past_its_aborted_transaction_is_refused_and_hangs_nothing(broker_factory):
    """The hanging transaction Kafka needed KIP-890 for, with a real client through the proxy: the network holds
    the producer's Produce request until the client gives the batch up and aborts the transaction, then delivers
    it, same producer epoch, a sequence never stored. Stored, it would open a transaction no one ends and hold the
    last stable offset for ever; kop refuses it (INVALID_TXN_STATE), and the transactional id's next transaction
    commits.

    The next transaction is a new producer's: kafka-python 3.0.12, having given up a batch it had sent, neither
    bumps its epoch (Java's client does, KIP-360) nor rewinds the partition's sequence, so its next batch of that
    epoch carries sequence 1 where the ABORT marker left none stored. Kafka and kop refuse that batch
    OUT_OF_ORDER_SEQUENCE_NUMBER; the client then bumps its epoch, drops the partition from its transaction and
    reports the commit done without the record. The request timeout is long (it bounds the delivery timeout from
    below): kafka-python takes a transactional request that times out for fatal, and EndTxn may wait 2 s for its
    markers after the state log's write."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError, RequestTimedOutError
    with FaultProxy() as proxy:
        broker = broker_factory({"advertised.port": str(proxy.port)})
        proxy.upstream_port = broker.port
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("kp-delayed") == ErrorCode.NONE
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, transactional_id="kp-delayed", linger_ms=0,
                                 request_timeout_ms=HELD_GIVEN_UP_MS, delivery_timeout_ms=HELD_GIVEN_UP_MS)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            proxy.delay_produce(True)
            held = producer.send("kp-delayed", b"held", partition=0)
            with pytest.raises((KafkaTimeoutError, RequestTimedOutError)):  # expired, or its request timed out
                held.get(timeout=30 + HELD_GIVEN_UP_MS / 1000)
            assert held.failed()  # the control that it was held: the client gave the batch up (get did not just wait)
            producer.abort_transaction()
            wait_lso(broker, "kp-delayed", 1)  # the ABORT marker alone
        finally:
            producer.close(timeout=0)  # its held request would keep it waiting
        assert proxy.delayed_requests() >= 1
        late = proxy.deliver_delayed()
        assert late and {code for _, _, code in late} == {ErrorCode.INVALID_TXN_STATE}, late
        with RawKafka(broker.port) as kafka:  # nothing stored after the marker, nothing left open
            assert kafka.end_offsets("kp-delayed", [0]) == kafka.end_offsets("kp-delayed", [0], committed=True) \
                == {0: 1}
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, transactional_id="kp-delayed", linger_ms=0)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("kp-delayed", b"after", partition=0).get(timeout=30)
            producer.commit_transaction()
        finally:
            producer.close(timeout=5)
        wait_lso(broker, "kp-delayed", 3)  # the COMMIT marker: EndTxn may be answered before it is stored
        assert values(ck_read_to_end(broker.bootstrap, "kp-delayed")) == [b"after"]  # the broker advertises the proxy
        assert values(ck_read_to_end(broker.bootstrap, "kp-delayed", isolation=READ_UNCOMMITTED)) == [b"after"]


def _committed_offset(broker, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_aiokafka_zombie_is_fenced(broker):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    async def go() -> str:
        zombie = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-fenced")
        successor = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-fenced")
        await zombie.start()
        try:
            await zombie.begin_transaction()
            await zombie.send_and_wait("aio-fenced", b"z", partition=0)
            await successor.start()  # InitProducerId: aborts the zombie's transaction under a new epoch
            with pytest.raises(KafkaError) as raised:
                await zombie.commit_transaction()
            async with successor.transaction():
                await successor.send_and_wait("aio-fenced", b"s", partition=0)
            return type(raised.value).__name__
        finally:
            await zombie.stop()
            await successor.stop()

    assert asyncio.run(go()) in ("ProducerFenced", "InvalidProducerEpoch")
    assert values(ck_read_to_end(broker.bootstrap, "aio-fenced")) == [b"s"]
    assert values(ck_read_to_end(broker.bootstrap, "aio-fenced", isolation=READ_UNCOMMITTED)) == [b"z", b"s"]


def test_aiokafka_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(broker_factory):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError
    broker = broker_factory(QUICK_TIMEOUTS)

    async def go() -> str:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-slow",
                                    transaction_timeout_ms=1000)
        await producer.start()
        try:
            await producer.begin_transaction()
            for i in range(2):
                await producer.send_and_wait("aio-slow", b"late%d" % i, partition=0)
            await asyncio.to_thread(wait_lso, broker, "aio-slow", 3)  # aborted: the marker is past the records
            with pytest.raises(KafkaError) as raised:
                await producer.commit_transaction()
            return type(raised.value).__name__
        finally:
            await producer.stop()

    assert asyncio.run(go()) in ("ProducerFenced", "InvalidProducerEpoch")
    assert ck_read_to_end(broker.bootstrap, "aio-slow") == []
    assert values(ck_read_to_end(broker.bootstrap, "aio-slow", isolation=READ_UNCOMMITTED)) == [b"late0", b"late1"]


def test_aiokafka_transaction_spans_partitions_and_topics(broker):
    from aiokafka import AIOKafkaProducer
    topics = create_spread_topics(broker, "aio-spread")
    aborted, committed = spread_records(topics, "aborted"), spread_records(topics, "committed")

    async def go() -> dict[str, tuple[list[bytes], list[bytes]]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-spread")
        await producer.start()
        try:
            for records, commit in ((aborted, False), (committed, True)):
                await producer.begin_transaction()
                await asyncio.gather(*(producer.send_and_wait(topic, value, partition=partition)
                                       for topic, partition, value in records))
                await (producer.commit_transaction() if commit else producer.abort_transaction())
        finally:
            await producer.stop()
        return {topic: (await aio_read(broker.bootstrap, topic, READ_COMMITTED, count, tuple(range(count))),
                        await aio_read(broker.bootstrap, topic, READ_UNCOMMITTED, 2 * count, tuple(range(count))))
                for topic, count in topics.items()}

    read = asyncio.run(go())
    for topic in topics:
        mine = lambda records: sorted(value for t, _, value in records if t == topic)
        assert sorted(read[topic][0]) == mine(committed)
        assert sorted(read[topic][1]) == sorted(mine(aborted) + mine(committed))


def test_aiokafka_offsets_sent_with_an_aborted_transaction_are_not_committed(broker):
    from aiokafka import AIOKafkaProducer, TopicPartition

    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-offsets")
        await producer.start()
        try:
            for offset, commit in ((2, True), (5, False)):
                await producer.begin_transaction()
                await producer.send_and_wait("aio-offsets", b"%d" % offset, partition=0)
                await producer.send_offsets_to_transaction({TopicPartition("aio-offsets", 0): offset},
                                                           "aio-offsets-group")
                await (producer.commit_transaction() if commit else producer.abort_transaction())
        finally:
            await producer.stop()

    asyncio.run(go())
    _assert_committed(broker, "aio-offsets-group", "aio-offsets", 2)  # control: the committed transaction's offset
    time.sleep(SETTLE_S)
    assert _committed_offset(broker, "aio-offsets-group", "aio-offsets") == 2  # not the aborted one's 5
    assert values(ck_read_to_end(broker.bootstrap, "aio-offsets")) == [b"2"]
