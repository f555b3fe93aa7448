"""Transactions in a cluster of brokers on one PostgreSQL database (kop/cluster/transactions.py): each transactional
id coordinated by the owner of its state log shard, markers written to partitions other brokers own, a transaction's
offsets handed to its group's coordinator on another broker, and kill -9 of the coordinator mid-transaction and
mid-commit. Real processes, a real PostgreSQL, confluent-kafka (librdkafka) as the transactional producer."""
import time

import pytest
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from integration.broker_process import free_port
from integration.idem_raw import LATEST, LIST_OFFSETS_VERSION, RawKafka, read_topic
from integration.pg_cluster import PgCluster
from integration.test_cluster import wait_until_served_by_leaders
from integration.test_groups_offsets import fetch_committed
from integration.txn_clients import READ_UNCOMMITTED, ck_read_to_end, values
from integration.waiting import wait_for
from kop.cluster import groups, transactions
from kop.cluster.ownership import owner_of
from protocol.errors import ErrorCode

NODES = [1, 2, 3]
PARTITIONS = 6
TRANSACTION_KEY = 1


@pytest.fixture
def cluster(tmp_path, postgres_url):
    made = PgCluster(str(tmp_path), postgres_url)
    yield made
    made.stop()


def txn_coordinator(transactional_id: str, nodes=NODES) -> int:
    return owner_of(f"{transactions.SHARD_TOPIC}-partition-{transactions.shard_of(transactional_id)}", nodes)


def group_coordinator(group: str, nodes=NODES) -> int:
    return owner_of(f"{groups.SHARD_TOPIC}-partition-{groups.shard_of(group)}", nodes)


def named(prefix: str, wanted: int, coordinator_of) -> str:
    """The first of prefix-0, prefix-1, ... whose coordinator among the three brokers is `wanted`."""
    return next(f"{prefix}-{i}" for i in range(1000) if coordinator_of(f"{prefix}-{i}") == wanted)


def found_coordinator(port: int, key: str) -> int:
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
    with RawKafka(port, timeout=5) as kafka:
        answer = kafka.call(FindCoordinatorRequest[1](key=key, key_type=TRANSACTION_KEY), FindCoordinatorResponse, 1)
    return answer.node_id if answer.error_code == ErrorCode.NONE else -1


def txn_state(port: int, transactional_id: str) -> str:
    """The transaction's state as the broker on `port` describes it ("" when it does not coordinate it)."""
    with RawKafka(port, timeout=5) as kafka:
        answer = kafka.call(DescribeTransactionsRequest[0](transactional_ids=[transactional_id]),
                            DescribeTransactionsResponse, 0)
    state = answer.transaction_states[0]
    return state.transaction_state if state.error_code == ErrorCode.NONE else ""


def offset_fetch(kafka: RawKafka, group: str, topic: str, require_stable: bool) -> tuple[int, int]:
    """OffsetFetch v7 of partition 0: (error code, committed offset)."""
    request = OffsetFetchRequest[7](group_id=group, require_stable=require_stable, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])])
    answer = kafka.call(request, OffsetFetchResponse, 7).topics[0].partitions[0]
    return answer.error_code, answer.committed_offset


def stable_and_end(cluster: PgCluster, topic: str, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of a partition, from the broker that serves it."""
    def offsets(kafka: RawKafka, isolation: int) -> int:
        request = ListOffsetsRequest[LIST_OFFSETS_VERSION](replica_id=-1, isolation_level=isolation, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=partition, current_leader_epoch=-1, timestamp=LATEST)])])
        answer = kafka.call(request, ListOffsetsResponse, LIST_OFFSETS_VERSION)
        found = answer.topics[0].partitions[0]
        assert found.error_code == ErrorCode.NONE, found
        return found.offset
    node = wait_for(lambda: cluster.serving(topic, partition), f"a broker serving {topic}-{partition}")
    with RawKafka(cluster.port(node)) as kafka:
        return offsets(kafka, 1), offsets(kafka, 0)


def assert_nothing_hangs(cluster: PgCluster, topic: str) -> None:
    """Every partition's last stable offset reaches its end: no transaction is left open."""
    def settled():
        pairs = {p: stable_and_end(cluster, topic, p) for p in range(PARTITIONS)}
        return pairs if all(lso == end for lso, end in pairs.values()) else None
    wait_for(settled, f"every transaction on {topic} to end", 30)


def transactional_producer(cluster: PgCluster, transactional_id: str):
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 60_000, "reconnect.backoff.max.ms": 500,
                         "retry.backoff.ms": 50})
    producer.init_transactions(30)
    return producer


def produce_everywhere(producer, topic: str, prefix: str, count: int) -> list[bytes]:
    sent = [f"{prefix}{i}".encode() for i in range(count)]
    for i, value in enumerate(sent):
        producer.produce(topic, value, partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    return sent


def finish(producer, commit: bool, timeout: float = 60.0) -> None:
    """Commit or abort, retrying what the client calls retriable (its coordinator moving under it)."""
    from confluent_kafka import KafkaException
    deadline = time.monotonic() + timeout
    while True:
        try:
            (producer.commit_transaction if commit else producer.abort_transaction)(10)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def spread_topic(cluster: PgCluster, topic: str) -> dict[int, int]:
    with RawKafka(cluster.port(cluster.running()[0])) as kafka:
        assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    leaders = wait_until_served_by_leaders(cluster, topic, PARTITIONS)
    assert set(leaders.values()) == set(NODES), leaders  # the markers go to every broker
    return leaders


@pytest.mark.slow
def test_a_transaction_over_every_brokers_partitions_commits_its_records_and_its_groups_offsets(cluster):
    from confluent_kafka import Consumer, TopicPartition
    cluster.start(3)
    topic = "txn-spread"
    spread_topic(cluster, topic)
    coordinator = 2
    transactional_id = named("spread", coordinator, txn_coordinator)
    group = named("spread-group", 3, group_coordinator)  # another broker's group
    assert {found_coordinator(cluster.port(node), transactional_id) for node in NODES} == {coordinator}
    for node in (1, 3):  # the others refuse to coordinate it
        with RawKafka(cluster.port(node)) as kafka:
            answer = kafka.call(InitProducerIdRequest[1](transactional_id=transactional_id,
                                                         transaction_timeout_ms=10_000),
                                InitProducerIdResponse, 1)
        assert answer.error_code == ErrorCode.NOT_COORDINATOR, answer
    producer = transactional_producer(cluster, transactional_id)
    member = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    with RawKafka(cluster.port(3)) as on_group_coordinator:
        try:
            producer.begin_transaction()
            committed = produce_everywhere(producer, topic, "c", 24)
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], member.consumer_group_metadata(),
                                                 30)
            # The group's coordinator knows a transaction holds the offset, though another broker coordinates it
            assert offset_fetch(on_group_coordinator, group, topic, require_stable=True)[0] == \
                ErrorCode.UNSTABLE_OFFSET_COMMIT
            finish(producer, commit=True)
            wait_for(lambda: offset_fetch(on_group_coordinator, group, topic, require_stable=True) ==
                     (ErrorCode.NONE, 5), "the committed transaction's offset, stable")
            producer.begin_transaction()
            aborted = produce_everywhere(producer, topic, "a", 12)
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, 9)], member.consumer_group_metadata(),
                                                 30)
            assert offset_fetch(on_group_coordinator, group, topic, require_stable=True)[0] == \
                ErrorCode.UNSTABLE_OFFSET_COMMIT
            finish(producer, commit=False)
            wait_for(lambda: offset_fetch(on_group_coordinator, group, topic, require_stable=True) ==
                     (ErrorCode.NONE, 5), "the aborted transaction's offset gone, the committed one stable")
        finally:
            member.close()
    seen = values(ck_read_to_end(cluster.bootstrap, topic, range(PARTITIONS)))
    assert sorted(seen) == sorted(committed), sorted(set(seen) ^ set(committed))[:5]
    stored = values(ck_read_to_end(cluster.bootstrap, topic, range(PARTITIONS), isolation=READ_UNCOMMITTED))
    assert set(aborted) <= set(stored)  # the control: the aborted records were stored, and are not read
    assert fetch_committed(cluster.bootstrap, group)[(topic, 0)][0] == 5
    assert_nothing_hangs(cluster, topic)


def await_new_coordinator(cluster: PgCluster, transactional_id: str, victim: int) -> int:
    return wait_for(lambda: next((c for n in cluster.running() if (c := found_coordinator(cluster.port(n),
                                                                                            transactional_id))
                                  not in (-1, victim)), None), "another broker to coordinate the transaction", 30)


@pytest.mark.slow
def test_kill_of_the_transaction_coordinator_mid_transaction_commits_once_and_aborts_for_good(cluster):
    cluster.start(3)
    topic = "txn-kill-open"
    spread_topic(cluster, topic)
    victim = 1
    kept_id, dropped_id = named("kept", victim, txn_coordinator), named("dropped", victim, txn_coordinator)
    kept, dropped = transactional_producer(cluster, kept_id), transactional_producer(cluster, dropped_id)
    kept.begin_transaction()
    dropped.begin_transaction()
    committed = produce_everywhere(kept, topic, "k", 30)
    aborted = produce_everywhere(dropped, topic, "d", 30)
    assert txn_state(cluster.port(victim), kept_id) == "Ongoing"  # the control: open on the broker killed
    cluster.brokers[victim].kill()
    await_new_coordinator(cluster, kept_id, victim)
    finish(kept, commit=True)  # the new coordinator replayed the log: the transaction is there, and commits
    finish(dropped, commit=False)
    kept.begin_transaction()  # and the producer goes on
    later = produce_everywhere(kept, topic, "l", 12)
    finish(kept, commit=True)
    seen = values(ck_read_to_end(cluster.bootstrap, topic, range(PARTITIONS)))
    assert sorted(seen) == sorted(committed + later), sorted(set(seen) ^ set(committed + later))[:5]
    stored = values(ck_read_to_end(cluster.bootstrap, topic, range(PARTITIONS), isolation=READ_UNCOMMITTED))
    assert set(aborted) <= set(stored)
    assert_nothing_hangs(cluster, topic)


@pytest.mark.slow
def test_kill_of_the_transaction_coordinator_mid_commit_completes_the_commit_on_the_new_one(cluster):
    """The commit is decided (PrepareCommit stored) while a marker cannot be written: the broker of one partition
    is paused. The coordinator is killed then; the new one finds PrepareCommit in the log and writes every marker."""
    cluster.start(3, config={"broker.session.timeout.ms": "8000"})  # the paused broker keeps its lease meanwhile
    topic = "txn-kill-commit"
    leaders = spread_topic(cluster, topic)
    victim, held = 1, 2
    transactional_id = named("deciding", victim, txn_coordinator)
    producer = transactional_producer(cluster, transactional_id)
    producer.begin_transaction()
    committed = produce_everywhere(producer, topic, "c", 30)
    cluster.pause(held)
    try:
        producer.commit_transaction(30)  # answered once decided: its markers on the paused broker wait
        assert txn_state(cluster.port(victim), transactional_id) == "PrepareCommit"  # the control: mid-commit
        assert {p for p, leader in leaders.items() if leader == held}, leaders
        cluster.brokers[victim].kill()
    finally:
        cluster.resume(held)
    await_new_coordinator(cluster, transactional_id, victim)
    assert_nothing_hangs(cluster, topic)
    seen = values(ck_read_to_end(cluster.bootstrap, topic, range(PARTITIONS)))
    assert sorted(seen) == sorted(committed), sorted(set(seen) ^ set(committed))[:5]
    producer.begin_transaction()  # the next transaction of the same producer starts once that one completed
    later = produce_everywhere(producer, topic, "l", 12)
    finish(producer, commit=True)
    seen = values(ck_read_to_end(cluster.bootstrap, topic, range(PARTITIONS)))
    assert sorted(seen) == sorted(committed + later)


@pytest.mark.slow
def test_brokers_send_each_other_markers_on_the_listener_named_for_it(cluster):
    """Each broker's first listener advertises an address nobody listens on (as a client listener behind a load
    balancer the brokers cannot reach would); inter.broker.listener.name names the second one, which the markers of
    a transaction over every broker's partitions go through."""
    internal = {}
    for node in NODES:
        external, internal[node] = free_port(), free_port()
        cluster.add(node, {
            "listeners": f"EXTERNAL://127.0.0.1:{external},INTERNAL://127.0.0.1:{internal[node]}",
            "advertised.listeners": f"EXTERNAL://127.0.0.1:{free_port()},INTERNAL://127.0.0.1:{internal[node]}",
            "listener.security.protocol.map": "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL"}, port=external)
    cluster.wait_for_members(set(NODES))
    topic = "txn-internal"
    spread_topic(cluster, topic)
    transactional_id = named("internal", 1, txn_coordinator)
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": ",".join(f"127.0.0.1:{port}" for port in internal.values()),
                         "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    committed = produce_everywhere(producer, topic, "c", 12)
    finish(producer, commit=True)
    assert_nothing_hangs(cluster, topic)  # every marker written
    links = cluster.brokers[1].log_tail(400)
    assert f"inter-broker link to broker-2 at 127.0.0.1:{internal[2]} connected" in links, links[-2000:]
    stored = [r.value for p in range(PARTITIONS) for r in read_topic(cluster.port(cluster.serving(topic, p)), topic,
                                                                     [p])]
    assert set(committed) <= set(stored)
