"""Geo-replication between real brokers on loopback, each its own named cluster: records produced in every cluster
reach every other exactly once, in their order per partition and source, with replicated_from stopping loops in any
topology; the remote creates topics as needed; stats show each replicator's state."""
import time
import urllib.request
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from integration.geo import (by_source, end_offsets, replicate, replicate_everywhere, start_clusters, topic_stats,
                             wait_for, wait_for_records)
from integration.broker_process import free_port
from integration.clients import ck_consume_all
from integration.idem_raw import RawKafka, read_topic
from kop.admin.client import AdminClient as KopAdmin, cluster_resource, topic_resource
from kop.client.sequences import last_sequence_ids
from protocol.errors import ErrorCode


@pytest.fixture
def clusters(tmp_path):
    started = {}

    def make(*names: str, config: dict[str, str] | None = None):
        started.update(start_clusters(tmp_path, names, config))
        return started

    yield make
    for broker in started.values():
        broker.stop()


def produce(bootstrap: str, topic: str, source: str, count: int, partitions: int) -> None:
    """count records `source:i` from an idempotent confluent-kafka producer, record i to partition i % partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    failures = []
    for i in range(count):
        producer.produce(topic, f"{source}:{i}".encode(), partition=i % partitions,
                         on_delivery=lambda err, _msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failures, failures


def check_everything_once(broker, topic: str, partitions: int, sources: dict[str, int]) -> None:
    """Every `source:i` once in the cluster, and each source's records in order within each partition: read by a
    confluent-kafka consumer, and checked against everything the partitions hold (read by offset)."""
    records = read_topic(broker.port, topic, range(partitions))
    consumed = ck_consume_all(broker.bootstrap, topic, len(records), partitions=range(partitions))
    assert sorted((r.partition, r.offset, r.value) for r in consumed) == \
        sorted((r.partition, r.offset, r.value) for r in records)
    counts = Counter(r.value for r in records)
    expected = {f"{s}:{i}".encode() for s, n in sources.items() for i in range(n)}
    assert set(counts) == expected
    assert [v for v, c in counts.items() if c > 1] == []
    for source, mine in by_source(records).items():
        for p in range(partitions):
            order = [int(r.value.split(b":")[1]) for r in mine if r.partition == p]
            assert order == sorted(order), f"{source} records out of order in partition {p}"


def test_two_clusters_replicate_both_ways_exactly_once(clusters):
    brokers = clusters("east", "west")
    replicate_everywhere(brokers, "orders", 3)
    for name, broker in brokers.items():
        produce(broker.bootstrap, "orders", name, 300, 3)
    for broker in brokers.values():
        wait_for_records(broker, "orders", 3, 600)
    for broker in brokers.values():
        check_everything_once(broker, "orders", 3, {"east": 300, "west": 300})
    east = topic_stats(brokers["east"], "orders")["replication"]["west"]
    assert east["replicationBacklog"] == 0 and east["connected"] and east["lastError"] is None
    assert east["entriesReplicated"] > 0
    with urllib.request.urlopen(brokers["east"].admin_url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'kop_replication_backlog_entries{partition="0",remote="west",topic="orders"} 0.0' in metrics
    assert 'kop_replication_failing{partition="2",remote="west",topic="orders"} 0.0' in metrics


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_three_clusters_all_to_all_no_loops(clusters):
    names = ("a", "b", "c")
    brokers = clusters(*names)
    replicate_everywhere(brokers, "events", 2)
    for name, broker in brokers.items():
        produce(broker.bootstrap, "events", name, 200, 2)
    for broker in brokers.values():
        wait_for_records(broker, "events", 2, 600)
    # what came from elsewhere is never sent on: after a pause nothing more arrives
    wait_for(lambda: all(topic_stats(b, "events")["replication"][r]["replicationBacklog"] == 0
                         for b in brokers.values() for r in topic_stats(b, "events")["replication"]), 30,
             "every replicator caught up")
    for broker in brokers.values():
        check_everything_once(broker, "events", 2, {name: 200 for name in names})


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_a_one_way_standby_never_sends_on_what_it_got_from_elsewhere(clusters):
    """a replicates to b only (b does not replicate back), b replicates to c: what b got from a is not sent on to c
    (Pulsar's rule: entries with replicated_from set never are). `direct` also lists c in a's policy: c gets a's
    records from a itself, once."""
    brokers = clusters("a", "b", "c")
    a, b, c = brokers["a"], brokers["b"], brokers["c"]
    replicate(a, ["a", "b"])
    replicate(b, ["b", "c"])
    for broker in (a, b):
        with RawKafka(broker.port) as kafka:
            for topic in ("chain", "direct"):
                assert kafka.create_topic(topic, 2) == ErrorCode.NONE
    KopAdmin(a.admin_url).post(topic_resource("direct", "replication"), ["a", "b", "c"])
    for topic in ("chain", "direct"):
        produce(a.bootstrap, topic, "a", 100, 2)
        produce(b.bootstrap, topic, "b", 50, 2)
    for topic, in_c in (("chain", 50), ("direct", 150)):
        wait_for_records(b, topic, 2, 150)
        wait_for_records(c, topic, 2, in_c)
        wait_for(lambda: topic_stats(b, topic)["replication"]["c"]["replicationBacklog"] == 0, 30,
                 f"b's replicator of {topic} caught up")
        assert topic_stats(b, topic)["replication"]["c"]["entriesSkipped"] >= 2  # control: a's entries reached b
        check_everything_once(b, topic, 2, {"a": 100, "b": 50})
    check_everything_once(c, "chain", 2, {"b": 50})
    check_everything_once(c, "direct", 2, {"a": 100, "b": 50})


def test_topic_and_partitions_created_on_the_remote(clusters):
    brokers = clusters("east", "west")
    replicate(brokers["east"], ["east", "west"])  # one way: west replicates nothing back
    with RawKafka(brokers["east"].port) as kafka:
        assert kafka.create_topic("fresh", 4) == ErrorCode.NONE
    produce(brokers["east"].bootstrap, "fresh", "east", 40, 4)
    wait_for_records(brokers["west"], "fresh", 4, 40)
    check_everything_once(brokers["west"], "fresh", 4, {"east": 40})
    assert topic_stats(brokers["west"], "fresh")["metadata"]["partitions"] == 4
    assert topic_stats(brokers["west"], "fresh")["replication"] == {}
    admin = AdminClient({"bootstrap.servers": brokers["east"].bootstrap})
    admin.create_partitions([NewPartitions("fresh", 6)])["fresh"].result(30)
    wait_for(lambda: len(Producer({"bootstrap.servers": brokers["east"].bootstrap}).list_topics("fresh", 10)
                         .topics["fresh"].partitions) == 6, 10, "six partitions in east")
    produce(brokers["east"].bootstrap, "fresh", "grown", 60, 6)
    wait_for_records(brokers["west"], "fresh", 6, 100)
    assert topic_stats(brokers["west"], "fresh")["metadata"]["partitions"] == 6
    check_everything_once(brokers["west"], "fresh", 6, {"east": 40, "grown": 60})


def test_a_topic_deleted_and_created_again_is_replicated_in_full(clusters):
    """The re-created topic's positions start again at those of the old one: the remote, which still holds the old
    topic's records, stores the new topic's after them rather than taking them for entries it has."""
    brokers = clusters("east", "west")
    east, west = brokers["east"], brokers["west"]
    replicate(east, ["east", "west"])
    with RawKafka(east.port) as kafka:
        assert kafka.create_topic("reborn", 1) == ErrorCode.NONE
    produce(east.bootstrap, "reborn", "first", 10, 1)
    wait_for_records(west, "reborn", 1, 10)
    admin = AdminClient({"bootstrap.servers": east.bootstrap})
    admin.delete_topics(["reborn"])["reborn"].result(30)
    wait_for(lambda: "reborn" not in Producer({"bootstrap.servers": east.bootstrap}).list_topics(timeout=10).topics,
             10, "the topic deleted in east")
    with RawKafka(east.port) as kafka:
        assert kafka.create_topic("reborn", 1) == ErrorCode.NONE
    produce(east.bootstrap, "reborn", "second", 10, 1)
    assert end_offsets(east, "reborn", 1) == {0: 10}  # control: the new topic starts again at offset 0
    wait_for_records(west, "reborn", 1, 20, timeout=20)
    check_everything_once(west, "reborn", 1, {"first": 10, "second": 10})
    values = [r.value for r in read_topic(west.port, "reborn", [0])]
    assert values[:10] == [f"first:{i}".encode() for i in range(10)]


def produce_with_sequence_ids(bootstrap: str, topic: str, ids: range) -> dict[int, int]:
    """Records `app:i` that carry the application producer name `loader` and sequence id i, all to partition 0;
    returns the offset each record's delivery report gave, by i."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    offsets: dict[int, int] = {}
    failures = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(err)
        else:
            offsets[int(msg.value().split(b":")[1])] = msg.offset()

    for i in ids:
        producer.produce(topic, f"app:{i}".encode(), partition=0, on_delivery=on_delivery,
                         headers=[("kop.producer.name", b"loader"), ("kop.sequence.id", str(i).encode())])
    assert producer.flush(30) == 0
    assert not failures, failures
    return offsets


def stored_offsets(broker, topic: str) -> dict[bytes, int]:
    """Each record's offset in partition 0, by value."""
    return {r.value: r.offset for r in read_topic(broker.port, topic, [0])}


def test_a_producer_that_fails_over_is_deduplicated_by_its_sequence_ids_in_the_other_cluster(clusters):
    """The application sequence ids of replicated records are the other cluster's deduplication state too: a
    producer that loses east and sends everything again to west stores nothing twice there."""
    brokers = clusters("east", "west")
    replicate(brokers["east"], ["east", "west"])
    with RawKafka(brokers["east"].port) as kafka:
        assert kafka.create_topic("loads", 1) == ErrorCode.NONE
    produce_with_sequence_ids(brokers["east"].bootstrap, "loads", range(100))
    wait_for_records(brokers["west"], "loads", 1, 100)
    produce_with_sequence_ids(brokers["west"].bootstrap, "loads", range(150))  # from the start again, and more
    values = [r.value for r in read_topic(brokers["west"].port, "loads", [0])]
    assert sorted(values) == sorted(f"app:{i}".encode() for i in range(150))
    stats = topic_stats(brokers["west"], "loads")["partitions"]
    assert sum(p["namedSequences"]["duplicatesDropped"] for p in stats.values()) == 100  # control: they were sent


def east_to_west(clusters, topic: str):
    """Clusters east and west, east replicating to west, each holding `topic` (one partition) from the start."""
    brokers = clusters("east", "west")
    replicate(brokers["east"], ["east", "west"])
    for broker in brokers.values():
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic(topic, 1) == ErrorCode.NONE
    return brokers["east"], brokers["west"]


def test_a_producer_that_fails_over_is_answered_the_offsets_its_records_have_in_the_other_cluster(clusters):
    """Records east stored, sent again to west after they were replicated (a producer that never heard east's
    answer): west drops them and answers with the offsets they have in west, where its consumers see them."""
    east, west = east_to_west(clusters, "loads")
    produce(west.bootstrap, "loads", "west", 3, 1)  # west's own records first: the clusters' offsets differ
    produce_with_sequence_ids(east.bootstrap, "loads", range(20))
    wait_for_records(west, "loads", 1, 23)
    in_west, in_east = stored_offsets(west, "loads"), stored_offsets(east, "loads")
    assert in_west[b"app:5"] != in_east[b"app:5"]  # control: an answer with east's offsets would show
    answered = produce_with_sequence_ids(west.bootstrap, "loads", range(5, 10))
    assert answered == {i: in_west[b"app:%d" % i] for i in range(5, 10)}
    stats = topic_stats(west, "loads")["partitions"]
    assert sum(p["namedSequences"]["duplicatesDropped"] for p in stats.values()) == 5  # control: all duplicates
    assert stored_offsets(west, "loads") == in_west


def test_a_producer_that_fails_over_before_replication_caught_up_stores_nothing_twice(clusters):
    """The producer resumes in west from west's last sequence id, so it writes there what east has not replicated
    yet; when east's copies arrive, the records west already has by their sequence ids are dropped from them."""
    east, west = east_to_west(clusters, "loads")
    registry = KopAdmin(east.admin_url)
    registry.post(cluster_resource("west"), {"brokerServiceUrl": f"127.0.0.1:{free_port()}"})  # east cannot reach west
    produce_with_sequence_ids(east.bootstrap, "loads", range(100))
    assert last_sequence_ids(west.admin_url, "loads", "loader") == {}  # control: nothing replicated yet
    produce_with_sequence_ids(west.bootstrap, "loads", range(150))  # fails over: from west's last id, and more
    registry.post(cluster_resource("west"), {"brokerServiceUrl": west.bootstrap})
    wait_for(lambda: topic_stats(east, "loads")["replication"]["west"]["replicationBacklog"] == 0, 30,
             "east's entries replicated to west")
    values = [r.value for r in read_topic(west.port, "loads", [0])]
    assert sorted(values) == sorted(f"app:{i}".encode() for i in range(150))
    stats = topic_stats(west, "loads")["partitions"]
    assert sum(p["namedSequences"]["duplicatesDropped"] for p in stats.values()) == 100  # east's copies
    assert topic_stats(east, "loads")["replication"]["west"]["entriesReplicated"] > 0


def test_only_committed_transactions_are_replicated(clusters):
    """Aborted transactions' records stay home, committed ones go (as plain records), and an open transaction holds
    the replicator back until it is decided."""
    brokers = clusters("east", "west")
    east, west = brokers["east"], brokers["west"]
    replicate(east, ["east", "west"])
    with RawKafka(east.port) as kafka:
        assert kafka.create_topic("txn", 1) == ErrorCode.NONE
    producer = Producer({"bootstrap.servers": east.bootstrap, "transactional.id": "geo-txn"})
    producer.init_transactions(30)
    for outcome, name in (("commit", "committed"), ("abort", "aborted")):
        producer.begin_transaction()
        for i in range(20):
            producer.produce("txn", f"{name}:{i}".encode(), partition=0)
        producer.flush(30)
        getattr(producer, f"{outcome}_transaction")(30)
    producer.begin_transaction()
    producer.produce("txn", b"open:0", partition=0)
    producer.flush(30)
    wait_for_records(west, "txn", 1, 20)
    time.sleep(1)  # the open transaction holds everything after it back
    assert sorted(r.value for r in read_topic(west.port, "txn", [0])) == sorted(
        f"committed:{i}".encode() for i in range(20))
    producer.commit_transaction(30)
    wait_for_records(west, "txn", 1, 21)
    values = [r.value for r in read_topic(west.port, "txn", [0])]
    assert sorted(values) == sorted([f"committed:{i}".encode() for i in range(20)] + [b"open:0"])
    consumer_values = [r.value for r in ck_consume_all(west.bootstrap, "txn", 21)]
    assert sorted(consumer_values) == sorted(values)
