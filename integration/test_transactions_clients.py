"""Transactions with kafka-python's and aiokafka's transactional producers and read_committed consumers: commit,
abort, offsets sent to a transaction, and a zombie fenced by a second producer with the same transactional id."""
import asyncio
import time

import pytest

from integration.txn_clients import READ_COMMITTED, READ_UNCOMMITTED, ck_read_to_end, values

SETTLE_S = 1.0  # after the expected records: long enough for an unexpected one to show up


def kp_read(bootstrap: str, topic: str, isolation: str, expected: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level=isolation)
    try:
        consumer.assign([TopicPartition(topic, 0)])
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
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

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
        read = {}
        for isolation, expected in ((READ_COMMITTED, 4), (READ_UNCOMMITTED, 5)):
            consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                        auto_offset_reset="earliest", isolation_level=isolation)
            await consumer.start()
            try:
                consumer.assign([TopicPartition("aio-txn", 0)])
                await consumer.seek_to_beginning()
                out: list[bytes] = []
                deadline = time.monotonic() + 20
                while len(out) < expected and time.monotonic() < deadline:
                    for batch in (await consumer.getmany(timeout_ms=200)).values():
                        out.extend(m.value for m in batch)
                for batch in (await consumer.getmany(timeout_ms=int(SETTLE_S * 1000))).values():
                    out.extend(m.value for m in batch)
                read[isolation] = out
            finally:
                await consumer.stop()
        return read[READ_COMMITTED], read[READ_UNCOMMITTED]

    committed, everything = asyncio.run(go())
    assert committed == [b"c0", b"c1", b"c2", b"o0"]
    assert everything == [b"c0", b"c1", b"c2", b"a0", b"o0"]
    _assert_committed(broker, "aio-group", "aio-txn", 2)


def _assert_committed(broker, group: str, topic: str, offset: int) -> None:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 10
        while (found := consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset) != offset:
            assert time.monotonic() < deadline, f"{group} committed {found} on {topic}-0, expected {offset}"
            time.sleep(0.1)
    finally:
        consumer.close()
