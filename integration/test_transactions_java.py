"""The Java client's transactional producer against kop: commit, abort, a zombie fenced, a transaction over several
partitions and topics, and a transaction aborted past its timeout; its read_committed consumer over aborted and open
transactions; and the consume-transform-produce loop with sendOffsetsToTransaction, read back read_committed (through
faults: in test_transactions_loop.py)."""

import pytest
from confluent_kafka import Producer

from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_read_to_end, java_transactions, java_unavailable_reason
from integration.txn_clients import READ_COMMITTED, READ_UNCOMMITTED, ck_open_transaction, ck_read_to_end, values
from protocol.errors import ErrorCode

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())


def test_java_commits_aborts_and_is_fenced_by_a_second_producer(broker):
    summary = java_transactions(broker.bootstrap, "commit-abort", topic="java-txn", transactional_id="java-txn",
                                count=5)
    assert summary["fenced"] is True
    committed = [b"c-%d" % i for i in range(5)]
    assert values(ck_read_to_end(broker.bootstrap, "java-txn")) == committed
    assert values(ck_read_to_end(broker.bootstrap, "java-txn", isolation=READ_UNCOMMITTED)) == \
        committed + [b"a-%d" % i for i in range(5)]


@pytest.mark.slow  # 5-10 s: a JVM and four reads; make test keeps the Java client's other transaction tests
def test_java_transaction_spans_partitions_and_topics(broker):
    topics = {"java-spread-a": 3, "java-spread-b": 2}
    with RawKafka(broker.port) as kafka:
        for topic, count in topics.items():
            assert kafka.create_topic(topic, partitions=count) == ErrorCode.NONE
    summary = java_transactions(broker.bootstrap, "spread", transactional_id="java-spread",
                                topics=",".join(f"{topic}:{count}" for topic, count in topics.items()))
    assert summary["records"] == 5
    for topic, count in topics.items():  # read by librdkafka: the Java consumer's side is tested above
        partitions = tuple(range(count))
        assert sorted(ck_read_to_end(broker.bootstrap, topic, partitions)) == \
            [(p, 2, f"c-{topic}-{p}".encode()) for p in partitions]  # after its aborted record and the ABORT marker
        assert sorted(ck_read_to_end(broker.bootstrap, topic, partitions, isolation=READ_UNCOMMITTED)) == \
            sorted([(p, 0, f"a-{topic}-{p}".encode()) for p in partitions] +
                   [(p, 2, f"c-{topic}-{p}".encode()) for p in partitions])
        with RawKafka(broker.port) as kafka:  # each partition's transactions ended: the COMMIT marker is the last
            assert kafka.end_offsets(topic, partitions, committed=True) == {p: 4 for p in partitions}


def test_java_consume_transform_produce_copies_each_record_once_with_its_offsets(broker, ck_producers):
    seed = ck_producers({"bootstrap.servers": broker.bootstrap})
    for i in range(60):
        seed.produce("ctp-in", b"%d" % i, partition=0)
    assert seed.flush(15) == 0
    summary = java_transactions(broker.bootstrap, "copy", input="ctp-in", output="ctp-out", group="ctp", count=60,
                                batch=7)
    assert summary["copied"] == 60 and summary["transactions"] >= 60 // 7
    assert values(ck_read_to_end(broker.bootstrap, "ctp-out")) == [b"out-%d" % i for i in range(60)]
    # Run again: the group's offsets were committed with the transactions, so nothing is copied twice.
    seed.produce("ctp-in", b"60", partition=0)
    assert seed.flush(15) == 0
    again = java_transactions(broker.bootstrap, "copy", input="ctp-in", output="ctp-out", group="ctp", count=1,
                              batch=7)
    assert again["copied"] == 1
    assert values(ck_read_to_end(broker.bootstrap, "ctp-out")) == [b"out-%d" % i for i in range(61)]


def test_java_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(broker_factory):
    broker = broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    summary = java_transactions(broker.bootstrap, "timeout", topic="java-slow", transactional_id="java-slow", count=2,
                                transaction_timeout_ms=1000)
    assert "ProducerFencedException" in (summary["error"], summary["cause"]), summary
    assert ck_read_to_end(broker.bootstrap, "java-slow") == []
    assert values(ck_read_to_end(broker.bootstrap, "java-slow", isolation=READ_UNCOMMITTED)) == [b"late-0", b"late-1"]


def test_java_read_committed_skips_aborted_transactions_and_stops_at_an_open_one(broker, ck_producers):
    def opened(prefix: str, count: int):
        return ck_open_transaction(broker.bootstrap, "java-rc", prefix, count, ck_producers)

    opened("c", 3).commit_transaction(15)  # offsets 0-2, marker 3
    opened("a", 2).abort_transaction(15)  # 4-5, marker 6
    opened("d", 1).commit_transaction(15)  # 7, marker 8
    still_open = opened("o", 2)  # 9-10, open: the last stable offset is 9
    opened("l", 1).commit_transaction(15)  # 11, marker 12: after the open

    read_committed = {"isolation.level": READ_COMMITTED}
    records, ends = java_read_to_end(broker.bootstrap, "java-rc", extra_props=read_committed)
    assert [r.value for r in records] == ["c0", "c1", "c2", "d0"]
    assert ends == {0: 9}
    records, ends = java_read_to_end(broker.bootstrap, "java-rc", extra_props={"isolation.level": READ_UNCOMMITTED})
    assert [r.value for r in records] == ["c0", "c1", "c2", "a0", "a1", "d0", "o0", "o1", "l0"]  # the control
    assert ends == {0: 13}

    still_open.commit_transaction(15)
    records, ends = java_read_to_end(broker.bootstrap, "java-rc", extra_props=read_committed)
    assert [r.value for r in records] == ["c0", "c1", "c2", "d0", "o0", "o1", "l0"]
    assert ends == {0: 14}
