"""The Java client's transactional producer against kop: commit, abort and a zombie fenced; and the
consume-transform-produce loop with sendOffsetsToTransaction, read back read_committed, also through kill -9 and dropped connections."""
import threading
import time

import pytest
from confluent_kafka import Producer

from integration.fault_proxy import CutPolicy, FaultProxy
from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_transactions, java_unavailable_reason
from integration.txn_clients import READ_UNCOMMITTED, ck_read_to_end, values
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


def test_java_consume_transform_produce_through_three_kill_9s_copies_each_record_exactly_once(broker_factory):
    """kop killed -9 three times while the loop runs: transactions caught by a kill are aborted (by the client, or
    completed or aborted by kop after its restart), the loop goes back to the group's committed offsets, and the
    output read read_committed holds every input exactly once, in order per partition."""
    broker = broker_factory()
    two_partition_topics_with_input(broker, broker.bootstrap, "crash-in", "crash-out")
    result = {}

    def copy():
        result.update(java_transactions(broker.bootstrap, "copy", input="crash-in", output="crash-out",
                                        group="crash", count=3000, batch=50, deadline_s=150, timeout=200))

    runner = threading.Thread(target=copy)
    runner.start()
    for _ in range(3):
        time.sleep(2.0)
        broker.restart(hard=True)
    runner.join(220)
    assert not runner.is_alive()
    assert result["copied"] == 3000, result
    assert result["aborts"] > 0, result  # control: the kills caught transactions half done, which the loop aborted
    assert_each_input_copied_once(ck_read_to_end(broker.bootstrap, "crash-out", partitions=(0, 1), timeout=60))


def test_java_consume_transform_produce_through_dropped_connections_copies_each_record_exactly_once(
        broker_factory):
    """The proxy cuts the connection on every 10th Produce (12 times), the answer lost: the idempotent, transactional
    producer retries, and the output read read_committed holds every input exactly once, in order per partition."""
    with FaultProxy(policy=CutPolicy(every=10, max_cuts=12)) as proxy:
        broker = broker_factory({"advertised.port": str(proxy.port)})
        proxy.upstream_port = broker.port
        two_partition_topics_with_input(broker, broker.bootstrap, "cut-in", "cut-out")
        result = java_transactions(proxy.bootstrap, "copy", input="cut-in", output="cut-out", group="cut",
                                   count=3000, batch=50, deadline_s=150, timeout=200)
        assert proxy.stats().cuts > 0  # control: answers were lost
        assert result["copied"] == 3000, result
        # read through the proxy too: the broker advertises its port
        out = ck_read_to_end(proxy.bootstrap, "cut-out", partitions=(0, 1), timeout=60)
    assert_each_input_copied_once(out)


COPIED = 3000  # records of the fault runs' input, alternating between its two partitions


def two_partition_topics_with_input(broker, bootstrap: str, source: str, target: str) -> None:
    """Input and output topics of two partitions each; the input holds COPIED records, value i in partition i % 2."""
    with RawKafka(broker.port) as kafka:
        for topic in (source, target):
            assert kafka.create_topic(topic, partitions=2) == ErrorCode.NONE
    seed = Producer({"bootstrap.servers": bootstrap})
    for i in range(COPIED):
        seed.produce(source, b"%d" % i, partition=i % 2)
    assert seed.flush(30) == 0


def assert_each_input_copied_once(out: list[tuple[int, int, bytes]]) -> None:
    """The output read read_committed: every input exactly once, in order, in its input's partition."""
    for partition in (0, 1):
        assert [value for p, _, value in out if p == partition] == \
            [b"out-%d" % i for i in range(partition, COPIED, 2)]
