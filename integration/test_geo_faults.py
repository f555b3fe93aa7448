"""Replication through faults, between real brokers: responses of ReplicateEntries lost on cut connections, the
target killed -9 while it holds entries whose answers never reached the source, and the source killed -9 before its
replicator's cursor moved. Each time the target ends with every record exactly once, in order per partition, and
a control shows the fault happened: the proxy's cuts, and the resends the target found already stored (by source
position, from its deduplication state as reloaded after the kill: Pulsar #25861)."""
import threading
import time

import pytest
from confluent_kafka import Producer

from integration.fault_proxy import CutPolicy, FaultProxy
from integration.geo import end_offsets, replicate, start_clusters, topic_stats, wait_for, wait_for_records
from integration.idem_raw import RawKafka
from integration.test_admin import admin_json
from integration.test_geo_failover import consume, west_position
from integration.test_geo_replication import check_everything_once, produce
from kop.admin.client import AdminClient, cluster_resource
from protocol.errors import ErrorCode
from protocol.replication import REPLICATE_ENTRIES_KEY

PARTITIONS = 2


@pytest.fixture
def linked(tmp_path):
    """east replicates to west through a FaultProxy: (east, west, proxy)."""
    yield from link_through_proxy(tmp_path, {})


@pytest.fixture
def linked_snapshots(tmp_path):
    """As `linked`, with a snapshot every 100 ms and a snapshot timeout of 2 s."""
    yield from link_through_proxy(tmp_path, {"replicatedSubscriptionsSnapshotFrequencyMillis": "100",
                                             "replicatedSubscriptionsSnapshotTimeoutSeconds": "2"})


def link_through_proxy(tmp_path, config: dict[str, str]):
    brokers = start_clusters(tmp_path, ("east", "west"), config)
    east, west = brokers["east"], brokers["west"]
    proxy = FaultProxy(upstream_port=west.port).start()
    AdminClient(east.admin_url).post(cluster_resource("west"), {"brokerServiceUrl": proxy.bootstrap})
    replicate(east, ["east", "west"])
    with RawKafka(east.port) as kafka:
        assert kafka.create_topic("orders", PARTITIONS) == ErrorCode.NONE
    yield east, west, proxy
    proxy.stop()
    for broker in brokers.values():
        broker.stop()


def replicator(broker) -> dict:
    return topic_stats(broker, "orders")["replication"]["west"]


def resends_found_stored(broker) -> int:
    stats = topic_stats(broker, "orders")["partitions"]
    return sum(p["replication"]["west"]["duplicatesAtRemote"] for p in stats.values())


def wait_for_stored_unanswered(west) -> None:
    """Until west has stored held records on each partition. A replicator waits for each answer before its next
    request, so how many of the 300 get there while the answers are held depends on how the producer's batches and
    the replicator's reads interleave (waiting for all of them failed now and then under load, on main too)."""
    wait_for(lambda: all(end > 25 for end in end_offsets(west, "orders", PARTITIONS).values()), 60,
             "west to store held records on every partition")


def caught_up(east) -> None:
    wait_for(lambda: replicator(east)["replicationBacklog"] == 0, 30, "the replicator to catch up")


def records_in(broker) -> int:
    with RawKafka(broker.port) as kafka:
        return sum(kafka.end_offsets("orders", range(PARTITIONS)).values())


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_lost_answers_are_resent_and_stored_once(linked):
    east, west, proxy = linked
    proxy.set_policy(CutPolicy(every=2, max_cuts=4, apis=frozenset({REPLICATE_ENTRIES_KEY})))
    for round_ in range(8):  # several runs of entries, so several requests
        produce(east.bootstrap, "orders", f"east{round_}", 100, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 800)
    wait_for(lambda: replicator(east)["replicationBacklog"] == 0, 30, "the replicator to catch up")
    assert proxy.stats().cuts >= 2  # control: answers were lost ...
    assert resends_found_stored(east) >= 1  # ... after the target stored them, and the resends were found stored
    check_everything_once(west, "orders", PARTITIONS, {f"east{r}": 100 for r in range(8)})


def test_target_killed_while_answers_are_in_flight_keeps_its_watermark(linked):
    east, west, proxy = linked
    produce(east.bootstrap, "orders", "before", 50, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 50)
    caught_up(east)  # else the answer to the last of them may be held too, and the replicator sends nothing more
    proxy.hold_responses(True)  # west stores what comes; east never hears so
    produce(east.bootstrap, "orders", "held", 300, PARTITIONS)
    wait_for_stored_unanswered(west)
    west.kill()  # kill -9 holding stored entries whose answers were never sent on
    proxy.drop_held()
    proxy.hold_responses(False)
    assert replicator(east)["replicationBacklog"] > 0  # control: east still has to send them
    west.start()
    wait_for(lambda: replicator(east)["replicationBacklog"] == 0, 30, "the replicator to catch up")
    assert resends_found_stored(east) >= 1  # the reloaded west recognised the resends
    check_everything_once(west, "orders", PARTITIONS, {"before": 50, "held": 300})


def test_source_killed_before_its_cursor_moved_resends_once(linked):
    east, west, proxy = linked
    produce(east.bootstrap, "orders", "before", 50, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 50)
    caught_up(east)  # else the answer to the last of them may be held too, and the replicator sends nothing more
    proxy.hold_responses(True)
    produce(east.bootstrap, "orders", "held", 300, PARTITIONS)
    wait_for_stored_unanswered(west)
    east.kill()  # its replicator cursor never moved past what west holds
    proxy.drop_held()
    proxy.hold_responses(False)
    east.start()
    assert replicator(east)["replicationBacklog"] > 0 or resends_found_stored(east) > 0  # control: a rewind
    wait_for(lambda: replicator(east)["replicationBacklog"] == 0, 30, "the replicator to catch up")
    assert resends_found_stored(east) >= 1
    assert records_in(west) == 350
    check_everything_once(west, "orders", PARTITIONS, {"before": 50, "held": 300})


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_target_killed_while_data_flows(linked):
    """kill -9 of west while east's producer is writing and its replicator sending: west ends with everything once."""
    east, west, proxy = linked
    done = threading.Event()

    def write() -> None:  # 20 runs of 100 records, a new producer each
        for run in range(20):
            produce(east.bootstrap, "orders", f"flow{run}", 100, PARTITIONS)
            time.sleep(0.1)
        done.set()

    producer = threading.Thread(target=write)
    producer.start()
    wait_for(lambda: records_in(west) >= 300, 30, "replication under way")
    west.kill()
    wait_for(lambda: replicator(east)["lastError"] is not None, 20, "east to see west gone")  # control
    assert not done.is_set()  # control: east was still writing
    west.start()
    producer.join(60)
    assert done.is_set()
    wait_for_records(west, "orders", PARTITIONS, 2000)
    wait_for(lambda: replicator(east)["replicationBacklog"] == 0, 30, "the replicator to catch up")
    check_everything_once(west, "orders", PARTITIONS, {f"flow{run}": 100 for run in range(20)})


@pytest.mark.slow  # a kill -9, a restart and 2,000 records: make test-slow
def test_source_killed_while_data_flows(linked):
    """kill -9 of east while its producer is writing and its replicator sending: one idempotent producer, which
    retries across the restart, has every record acknowledged, and west ends with each of them once."""
    east, west, proxy = linked
    count = 2000
    producer = Producer({"bootstrap.servers": east.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    acknowledged: list[bytes] = []
    failures: list = []

    def delivered(err, msg) -> None:
        failures.append(err) if err else acknowledged.append(msg.value())

    def write() -> None:  # 20 runs of 100 records
        for i in range(count):
            producer.produce("orders", f"flow:{i}".encode(), partition=i % PARTITIONS, on_delivery=delivered)
            producer.poll(0)
            if i % 100 == 99:
                time.sleep(0.1)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_for(lambda: records_in(west) >= 300, 30, "replication under way")
        east.kill()
        producer.poll(0)
        assert len(acknowledged) < count  # control: east was killed with records still to acknowledge ...
        assert writer.is_alive() or records_in(west) < count  # ... still to take, or to replicate
        east.start()
    finally:
        writer.join(60)
    assert producer.flush(60) == 0
    assert not failures, failures
    assert sorted(acknowledged) == sorted(f"flow:{i}".encode() for i in range(count))
    wait_for_records(west, "orders", PARTITIONS, count)
    caught_up(east)
    check_everything_once(east, "orders", PARTITIONS, {"flow": count})
    check_everything_once(west, "orders", PARTITIONS, {"flow": count})


def entries_in(broker) -> int:
    """Entries of the topic's partitions, markers included."""
    return topic_stats(broker, "orders")["numberOfEntries"]


def snapshot_request_answer_held(east, west, proxy) -> None:
    """The group commits in east; east's snapshot REQUESTs reach west (one way: west answers in the response), and
    west's answers are held in the proxy."""
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east", 20, PARTITIONS)
    wait_for_records(west, "orders", PARTITIONS, 20)
    caught_up(east)  # the data's answers reached east: held now, one would stall the replicator for its 30 s timeout
    before = entries_in(west)
    proxy.hold_responses(True)
    consume(east.bootstrap, "app", 20)
    wait_for(lambda: entries_in(west) >= before + PARTITIONS, 20, "the snapshot REQUESTs stored in west")
    assert west_position(west) == 0  # control: no answer reached east


def test_a_snapshot_request_sent_again_after_its_answer_was_lost_is_answered(linked):
    """Answered on the resend, long before the snapshot timeout (30 s here) would have it taken again."""
    east, west, proxy = linked
    snapshot_request_answer_held(east, west, proxy)
    proxy.drop_held()
    proxy.hold_responses(False)
    wait_for(lambda: west_position(west) == 20, 15, "the group's position in west")
    assert resends_found_stored(east) >= PARTITIONS  # control: the REQUESTs were found stored, and answered


def test_a_snapshot_whose_answer_is_lost_for_good_is_taken_again_without_new_data(linked_snapshots):
    """west is killed while it holds the REQUESTs: restarted, it finds them stored but no longer knows where; the
    snapshots time out and are taken again, though no data comes after them."""
    east, west, proxy = linked_snapshots
    snapshot_request_answer_held(east, west, proxy)
    west.kill()
    proxy.drop_held()
    proxy.hold_responses(False)
    west.start()
    wait_for(lambda: west_position(west) == 20, 30, "the group's position in west")
    timed_out = sum(p["replicatedSubscriptionSnapshots"]["timedOutSnapshots"]
                    for p in topic_stats(east, "orders")["partitions"].values())
    assert timed_out >= PARTITIONS  # control: the first snapshots were lost
    assert resends_found_stored(east) >= PARTITIONS  # ... and their REQUESTs found stored after the restart
