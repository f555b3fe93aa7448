"""The Java client's transactional producer against kop: commit, abort and a zombie fenced; and the
consume-transform-produce loop with sendOffsetsToTransaction, read back read_committed (through faults: in
test_transactions_loop.py)."""

import pytest
from confluent_kafka import Producer

from integration.java_client import java_available, java_transactions, java_unavailable_reason
from integration.txn_clients import READ_UNCOMMITTED, ck_read_to_end, values

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())


def test_java_commits_aborts_and_is_fenced_by_a_second_producer(broker):
    summary = java_transactions(broker.bootstrap, "commit-abort", topic="java-txn", transactional_id="java-txn",
                                count=5)
    assert summary["fenced"] is True
    committed = [b"c-%d" % i for i in range(5)]
    assert values(ck_read_to_end(broker.bootstrap, "java-txn")) == committed
    assert values(ck_read_to_end(broker.bootstrap, "java-txn", isolation=READ_UNCOMMITTED)) == \
        committed + [b"a-%d" % i for i in range(5)]


def test_java_consume_transform_produce_copies_each_record_once_with_its_offsets(broker):
    seed = Producer({"bootstrap.servers": broker.bootstrap})
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
