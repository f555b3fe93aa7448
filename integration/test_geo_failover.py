"""PIP-33 for Kafka consumer groups between real brokers: a replicated group consumes part of a topic in east and
commits; east is killed -9; the same group.id in west resumes near where it stopped. Every record is consumed at
least once across the two clusters, and the duplicates are fewer than what east had consumed (a group west knew
nothing of would start over: the control). Snapshot markers take no offset and reach no consumer, and stop when no
data flows."""
import shutil
import time

import pytest
from confluent_kafka import Consumer

from integration.geo import (end_offsets, replicate, replicate_everywhere, start_clusters, topic_stats, wait_for,
                             wait_for_records)
from integration.broker_process import free_port
from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_consume_all, java_group_consume, java_unavailable_reason
from integration.test_admin import admin_change, admin_json
from integration.test_geo_replication import produce
from kop.admin.client import AdminClient, cluster_resource
from protocol.errors import ErrorCode

PARTITIONS = 2
ROUNDS, PER_ROUND = 8, 50
TOTAL = ROUNDS * PER_ROUND
FAST_SNAPSHOTS = {"replicatedSubscriptionsSnapshotFrequencyMillis": "100"}


@pytest.fixture
def pair(tmp_path):
    brokers = start_clusters(tmp_path, ("east", "west"), FAST_SNAPSHOTS)
    replicate_everywhere(brokers, "orders", PARTITIONS)
    yield brokers["east"], brokers["west"]
    for broker in brokers.values():
        broker.stop()


def consume_with(client: str, bootstrap: str, group: str, count: int | None) -> list[bytes]:
    if client == "confluent-kafka":
        return consume(bootstrap, group, count)
    if not java_available():
        pytest.skip(java_unavailable_reason())
    result = java_group_consume(bootstrap, "orders", group, max_records=count or 1_000_000, idle_ms=3000,
                                timeout=60)
    return [record.value.encode() for record in result.records]


def consume(bootstrap: str, group: str, count: int | None, timeout: float = 30.0) -> list[bytes]:
    """Consume with a confluent-kafka group member, committing after every record; stop after `count` records (None:
    once nothing came for 3 s)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    values: list[bytes] = []
    deadline, idle_since = time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline and (count is None or len(values) < count):
            message = consumer.poll(0.2)
            if message is None:
                if count is None and values and time.monotonic() - idle_since > 3:
                    break
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
            consumer.commit(message, asynchronous=False)
            idle_since = time.monotonic()
    finally:
        consumer.close()
    return values


def west_position(broker) -> int:
    """The group's committed offsets in a cluster, summed over the partitions (0 while it has none)."""
    group = topic_stats(broker, "orders")["subscriptions"].get("app")
    return sum(p["committedOffset"] for p in group["partitions"].values()) if group else 0


def produce_in_rounds(broker, first: int = 0) -> None:
    """Data in rounds with pauses, so snapshots complete at many offsets while it flows."""
    for round_ in range(first, ROUNDS):
        produce(broker.bootstrap, "orders", f"east{round_}", PER_ROUND, PARTITIONS)
        time.sleep(0.3)


def expected() -> set[bytes]:
    return {f"east{r}:{i}".encode() for r in range(ROUNDS) for i in range(PER_ROUND)}


@pytest.mark.slow  # 20-45 s each: two kills, two restarts, five group consumers
@pytest.mark.parametrize("client", ["confluent-kafka", "java"])
def test_group_fails_over_to_the_other_cluster_and_back(pair, client):
    east, west = pair
    assert admin_json(east, "groups", "set-replicated", "app", "--enable")["replicated"] is True
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume_with(client, east.bootstrap, "app", PER_ROUND)  # the group commits before the rest flows
    produce_in_rounds(east, first=1)
    wait_for_records(west, "orders", PARTITIONS, TOTAL)
    # markers take no offset: each cluster's partitions end at the records they hold
    for broker in (east, west):
        with RawKafka(broker.port) as kafka:
            assert sum(kafka.end_offsets("orders", range(PARTITIONS)).values()) == TOTAL
    in_east += consume_with(client, east.bootstrap, "app", TOTAL // 2 - PER_ROUND)
    assert len(in_east) == TOTAL // 2
    wait_for(lambda: west_position(west) >= TOTAL // 2 - PER_ROUND, 20, "the group's updates in west")
    snapshots = topic_stats(east, "orders")["partitions"]
    assert all(p["replicatedSubscriptionSnapshots"]["completedSnapshots"] > 0 for p in snapshots.values())
    east.kill()
    in_west = consume_with(client, west.bootstrap, "app", None)
    consumed = in_east + in_west
    assert set(consumed) == expected()  # no loss; and nothing but records (no marker) was delivered
    duplicates = len(consumed) - TOTAL
    # within one round of data (several snapshot periods); a group west knew nothing of would repeat all 200
    assert 0 <= duplicates <= PER_ROUND, f"{duplicates} duplicates after failover"
    assert topic_stats(west, "orders")["subscriptions"]["app"]["isReplicated"] is True

    # fail back: west takes writes and the group follows them there; east comes back and catches up on both
    east.start()
    produce(west.bootstrap, "orders", "west", PER_ROUND, PARTITIONS)
    in_west += consume_with(client, west.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(east) >= TOTAL + PER_ROUND - PER_ROUND // 2, 30, "the group's updates in east")
    west.kill()
    back = consume_with(client, east.bootstrap, "app", None)
    everything = expected() | {f"west:{i}".encode() for i in range(PER_ROUND)}
    assert set(in_east + in_west + back) == everything
    assert len(back) <= PER_ROUND, f"{len(back)} records again after failing back"


def completed_snapshots(broker) -> list[int]:
    return [p["replicatedSubscriptionSnapshots"]["completedSnapshots"]
            for p in topic_stats(broker, "orders")["partitions"].values()]


@pytest.mark.slow  # 15 s: a kill -9 and restart, group consumers in both clusters
def test_group_fails_over_after_a_restart_of_the_source_before_any_new_snapshot(pair):
    """Snapshots complete while data flows; east is killed -9 and restarted, and no data comes after: the group goes
    on consuming in east, and its position still reaches west (from the snapshots east finds stored again), so it
    fails over near where it stopped."""
    east, west = pair
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, "app", PER_ROUND)
    produce_in_rounds(east, first=1)
    wait_for_records(west, "orders", PARTITIONS, TOTAL)
    wait_for(lambda: min(completed_snapshots(east)) >= ROUNDS // 2, 20, "snapshots over the data")
    time.sleep(0.5)  # the last ones complete
    east.kill()
    east.start()
    in_east += consume(east.bootstrap, "app", TOTAL // 2 - PER_ROUND)
    wait_for(lambda: west_position(west) >= TOTAL // 2 - PER_ROUND, 20, "the group's updates in west")
    # control: since the restart, at most the snapshot of all the data, taken at once, which the group has not
    # reached; its position came from the snapshots taken before the kill
    assert max(completed_snapshots(east)) <= 1
    assert "stored snapshots cached again" in east.log_tail(5000)
    east.kill()
    consumed = in_east + consume(west.bootstrap, "app", None)
    assert set(consumed) == expected()
    assert 0 <= len(consumed) - TOTAL <= PER_ROUND, f"{len(consumed) - TOTAL} duplicates after failover"


def test_snapshots_stop_without_traffic(pair):
    east, west = pair
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", 20, PARTITIONS)
    consume(east.bootstrap, "app", 20)

    def completed() -> int:
        return sum(p["replicatedSubscriptionSnapshots"]["completedSnapshots"]
                   for p in topic_stats(east, "orders")["partitions"].values())

    wait_for(lambda: completed() > 0, 20, "a snapshot")
    time.sleep(0.5)  # let the last one finish
    quiet = completed()
    time.sleep(1.5)  # fifteen periods without data
    assert completed() == quiet
    produce(east.bootstrap, "orders", "east1", 20, PARTITIONS)
    wait_for(lambda: completed() > quiet, 20, "snapshots to resume with data")


@pytest.fixture
def one_way(tmp_path):
    """east replicates to west; west replicates nothing back (a standby)."""
    brokers = start_clusters(tmp_path, ("east", "west"), FAST_SNAPSHOTS)
    replicate(brokers["east"], ["east", "west"])
    with RawKafka(brokers["east"].port) as kafka:
        assert kafka.create_topic("orders", PARTITIONS) == ErrorCode.NONE
    yield brokers["east"], brokers["west"]
    for broker in brokers.values():
        broker.stop()


@pytest.mark.slow  # 10-12 s: two clusters, kills and group consumers
def test_one_way_standby_takes_over_the_group(one_way):
    """Pulsar #9341: with replication one way only, Pulsar never completes a snapshot; kop's standby answers in the
    replication response."""
    east, west = one_way
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, "app", PER_ROUND)
    produce_in_rounds(east, first=1)
    in_east += consume(east.bootstrap, "app", TOTAL // 2 - PER_ROUND)
    wait_for(lambda: west_position(west) >= TOTAL // 2 - PER_ROUND, 20, "the group's updates in west")
    east.kill()
    consumed = in_east + consume(west.bootstrap, "app", None)
    assert set(consumed) == expected()
    assert 0 <= len(consumed) - TOTAL <= PER_ROUND


@pytest.mark.slow  # 10-15 s: two clusters, a kill and group consumers
def test_a_one_way_standby_holds_the_group_before_records_of_its_own(one_way):
    """west writes records of its own, which east never gets: the group's updates stop before them in west, so the
    group that fails over there consumes them (and again what east had sent after them), never skips them."""
    east, west = one_way
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(west) == PER_ROUND, 20, "the group's updates in west")  # control: they move it
    produce(west.bootstrap, "orders", "west", PARTITIONS, PARTITIONS)  # one record of its own per partition
    produce(east.bootstrap, "orders", "east1", PER_ROUND, PARTITIONS)
    in_east += consume(east.bootstrap, "app", PER_ROUND)
    wait_for(lambda: "held at offset" in west.log_tail(5000) or west_position(west) > PER_ROUND, 20,
             "the group's next update in west")
    assert west_position(west) == PER_ROUND  # held before west's own records, not moved past them
    east.kill()
    in_west = consume(west.bootstrap, "app", None)
    assert {f"west:{i}".encode() for i in range(PARTITIONS)} <= set(in_west)
    assert set(in_east + in_west) == {f"{s}:{i}".encode() for s, n in (("east0", PER_ROUND), ("east1", PER_ROUND),
                                                                      ("west", PARTITIONS)) for i in range(n)}


@pytest.fixture
def three(tmp_path):
    """a, b and c replicate to one another; the group `app` is flagged replicated in a."""
    brokers = start_clusters(tmp_path, ("a", "b", "c"), FAST_SNAPSHOTS)
    replicate_everywhere(brokers, "orders", PARTITIONS)
    admin_json(brokers["a"], "groups", "set-replicated", "app", "--enable")
    yield brokers["a"], brokers["b"], brokers["c"]
    for broker in brokers.values():
        broker.stop()


@pytest.mark.slow  # 15-25 s: three clusters, two kills and group consumers
def test_records_a_cluster_sent_to_one_other_only_are_not_skipped_by_a_failover_there(three):
    """c replicates to b only, then goes down: a's snapshots, taken with b alone, do not cover c's records in b, so
    b holds the group before them and the group that fails over to b consumes them."""
    a, b, c = three
    produce(a.bootstrap, "orders", "a0", PER_ROUND, PARTITIONS)
    in_a = consume(a.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(b) == PER_ROUND, 20, "the group in b")
    admin_change(c, "topics", "set-clusters", "orders", "--clusters", "b,c")
    produce(c.bootstrap, "orders", "c", PARTITIONS, PARTITIONS)
    wait_for_records(b, "orders", PARTITIONS, PER_ROUND + PARTITIONS)
    c.kill()
    produce(a.bootstrap, "orders", "a1", PER_ROUND, PARTITIONS)
    in_a += consume(a.bootstrap, "app", PER_ROUND)
    wait_for(lambda: "held at offset" in b.log_tail(5000) or west_position(b) > PER_ROUND, 20,
             "the group's next update in b")
    assert west_position(b) == PER_ROUND  # held before c's records, not moved past them
    a.kill()
    in_b = consume(b.bootstrap, "app", None)
    assert {f"c:{i}".encode() for i in range(PARTITIONS)} <= set(in_b)
    assert b"c:0" not in in_a  # control: a never had them


@pytest.mark.slow  # 20-30 s: two clusters, failed disk reads, two kills
def test_an_update_whose_application_failed_is_applied_again_after_a_restart(tmp_path):
    """west stores east's UPDATEs, but applying them fails (its reads of the partition fail, as on a disk error),
    and east, the group's source, is gone: no other UPDATE will come. Restarted, west reads the UPDATEs it had not
    applied back from its log and moves the group."""
    brokers = start_clusters(tmp_path, ("east", "west"), {**FAST_SNAPSHOTS, "adminFailpointsEnabled": "true"})
    east, west = brokers["east"], brokers["west"]
    try:
        replicate(east, ["east", "west"])  # one way: west reads its partitions only to apply the UPDATEs
        with RawKafka(east.port) as kafka:
            assert kafka.create_topic("orders", PARTITIONS) == ErrorCode.NONE
        admin_json(east, "groups", "set-replicated", "app", "--enable")
        produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
        consume(east.bootstrap, "app", PER_ROUND)
        wait_for(lambda: west_position(west) == PER_ROUND, 20, "the group in west")
        for partition in range(PARTITIONS):
            AdminClient(west.admin_url).post(f"/admin/v2/kop/failpoints/orders/{partition}",
                                             {"replay_read_failures": 100_000})
        produce(east.bootstrap, "orders", "east1", PER_ROUND, PARTITIONS)
        consume(east.bootstrap, "app", PER_ROUND)
        failed = [f"orders-{p}: an update of a replicated group failed" for p in range(PARTITIONS)]
        wait_for(lambda: all(line in west.log_tail(5000) for line in failed), 20,
                 "west's updates to fail on every partition")  # control: the fault happened
        assert west_position(west) == PER_ROUND
        east.kill()
        west.kill()
        west.start()
        wait_for(lambda: west_position(west) == 2 * PER_ROUND, 30, "the stored updates applied again")
    finally:
        for broker in brokers.values():
            broker.stop()


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_group_that_stopped_committing_still_gets_its_last_position_replicated(pair):
    """Pulsar #19551: the snapshot that covers a group's last commit completes after that commit; kop still sends
    the update, so the group resumes in west with nothing repeated."""
    east, west = pair
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    consume(east.bootstrap, "app", PER_ROUND)
    produce(east.bootstrap, "orders", "east1", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, "app", PER_ROUND)  # its last commits, then the group goes quiet
    wait_for(lambda: west_position(west) == 2 * PER_ROUND, 20, "the group's last position in west")
    east.kill()
    produce(west.bootstrap, "orders", "west", 10, PARTITIONS)
    assert sorted(consume(west.bootstrap, "app", None)) == sorted(f"west:{i}".encode() for i in range(10))
    assert len(in_east) == PER_ROUND


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_a_group_far_behind_the_newest_data_gets_its_position_replicated_as_it_catches_up(tmp_path):
    """Snapshots complete while the group lags, far more than the three a group may keep: it keeps three it can
    still pass (not the newest three, all beyond it), so consuming part of the way moves it in west."""
    brokers = start_clusters(tmp_path, ("east", "west"),
                             {**FAST_SNAPSHOTS, "replicatedSubscriptionsSnapshotMaxCachedPerSubscription": "3"})
    east, west = brokers["east"], brokers["west"]
    try:
        replicate_everywhere(brokers, "orders", PARTITIONS)
        admin_json(east, "groups", "set-replicated", "app", "--enable")
        produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
        consume(east.bootstrap, "app", PER_ROUND)
        wait_for(lambda: west_position(west) == PER_ROUND, 20, "the group's first update in west")
        produce_in_rounds(east, first=1)
        completed = sum(p["replicatedSubscriptionSnapshots"]["completedSnapshots"]
                        for p in topic_stats(east, "orders")["partitions"].values())
        assert completed > 3 * PARTITIONS + 2  # control: more snapshots ahead of the group than it may keep
        consume(east.bootstrap, "app", 2 * PER_ROUND)  # to 150 of 400
        wait_for(lambda: west_position(west) > PER_ROUND, 20, "the lagging group's position in west")
        assert west_position(west) <= 3 * PER_ROUND
    finally:
        for broker in brokers.values():
            broker.stop()


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_snapshots_go_on_between_the_clusters_that_are_up(three):
    """Beyond Pulsar (which stops them all): with c down, a and b keep snapshotting and b follows the group; when c
    is back, it follows too."""
    a, b, c = three
    produce(a.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    consume(a.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(c) == PER_ROUND, 20, "the group in c")
    c.kill()
    for round_ in range(1, 4):
        produce(a.bootstrap, "orders", f"east{round_}", PER_ROUND, PARTITIONS)
        consume(a.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(b) == 4 * PER_ROUND, 30, "b to follow the group while c is down")
    assert west_position(c.start()) == PER_ROUND  # control: c missed it all
    wait_for(lambda: topic_stats(a, "orders")["replication"]["c"]["connected"], 30, "a to reach c again")
    produce(a.bootstrap, "orders", "east4", PER_ROUND, PARTITIONS)
    consume(a.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(c) == 5 * PER_ROUND, 60, "c to follow the group again")


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_markers_reach_no_client(pair):
    """Every client reads exactly the records, at contiguous offsets, from partitions full of snapshot markers."""
    from integration.clients import aio_consume_all, ck_consume_all, kp_consume_all
    from integration.test_kcat import kcat

    east, west = pair
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    consume(east.bootstrap, "app", PER_ROUND)
    for round_ in range(1, 4):
        produce(east.bootstrap, "orders", f"east{round_}", PER_ROUND, PARTITIONS)
        consume(east.bootstrap, "app", PER_ROUND)
    total = 4 * PER_ROUND
    wait_for_records(west, "orders", PARTITIONS, total)
    wait_for(lambda: west_position(west) == total, 20, "the group's last position in west")
    controllers = [p["replicatedSubscriptionSnapshots"] for p in topic_stats(east, "orders")["partitions"].values()]
    assert all(c["completedSnapshots"] > 0 and c["updatesWritten"] > 0 for c in controllers)  # control: markers
    expected_values = {f"east{r}:{i}".encode() for r in range(4) for i in range(PER_ROUND)}

    def check(records) -> None:
        assert sorted(r.value if isinstance(r.value, bytes) else r.value.encode() for r in records) == \
            sorted(expected_values)
        for p in range(PARTITIONS):
            assert [r.offset for r in records if r.partition == p] == list(range(total // PARTITIONS))

    for broker in (east, west):
        check(kp_consume_all(broker.bootstrap, "orders", total))
        check(ck_consume_all(broker.bootstrap, "orders", total, partitions=range(PARTITIONS)))
    check(aio_consume_all(east.bootstrap, "orders", total, partitions=range(PARTITIONS)))
    if java_available():
        check(java_consume_all(east.bootstrap, "orders"))
    if shutil.which("kcat"):
        done = kcat(east, "-C", "-t", "orders", "-o", "beginning", "-e", "-f", "%p %o %s\\n")
        lines = [line.split(b" ") for line in done.stdout.splitlines()]
        assert sorted(value for _, _, value in lines) == sorted(expected_values)
        for p in range(PARTITIONS):
            assert [int(o) for q, o, _ in lines if int(q) == p] == list(range(total // PARTITIONS))


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_admin_toggles_replication_of_a_group_and_of_every_group(pair):
    east, west = pair
    assert admin_json(east, "groups", "get-replicated", "app") is False
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    consume(east.bootstrap, "app", PER_ROUND)
    assert topic_stats(east, "orders")["subscriptions"]["app"]["isReplicated"] is True
    wait_for(lambda: west_position(west) == PER_ROUND, 20, "the group in west")
    east.restart()  # the flag lives in the group's cursors
    assert admin_json(east, "groups", "get-replicated", "app") is True

    admin_json(east, "groups", "set-replicated", "app", "--disable")
    assert topic_stats(east, "orders")["subscriptions"]["app"]["isReplicated"] is False
    produce(east.bootstrap, "orders", "east1", PER_ROUND, PARTITIONS)
    consume(east.bootstrap, "app", PER_ROUND)
    time.sleep(1.5)  # fifteen snapshot periods
    assert west_position(west) == PER_ROUND  # no update any more

    # the namespace's policy replicates every group, flagged or not
    admin_change(east, "namespaces", "set-replicated-subscriptions", "public/default", "--enable")
    produce(east.bootstrap, "orders", "east2", PER_ROUND, PARTITIONS)
    consume(east.bootstrap, "app", PER_ROUND)
    wait_for(lambda: west_position(west) == 3 * PER_ROUND, 20, "the group in west again, by policy")


def test_a_flag_set_before_the_groups_first_commit_survives_a_crash(pair):
    """No cursor holds the flag of a group that has not committed yet: it is kept apart until the first commit, which
    replicates the group though the broker was killed in between."""
    east, west = pair
    admin_json(east, "groups", "set-replicated", "late", "--enable")
    admin_json(east, "groups", "set-replicated", "gone", "--enable")
    admin_json(east, "groups", "set-replicated", "gone", "--disable")
    east.restart(hard=True)  # kill -9
    assert admin_json(east, "groups", "get-replicated", "late") is True
    assert admin_json(east, "groups", "get-replicated", "gone") is False
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    consume(east.bootstrap, "late", PER_ROUND)
    assert topic_stats(east, "orders")["subscriptions"]["late"]["isReplicated"] is True
    east.restart(hard=True)  # from now on the flag is in the group's cursors
    assert admin_json(east, "groups", "get-replicated", "late") is True
    wait_for(lambda: (topic_stats(west, "orders")["subscriptions"].get("late") or {}).get("isReplicated"), 20,
             "the group in west")


@pytest.mark.slow  # 10-12 s: two clusters, kills and group consumers
def test_group_fails_over_with_data_written_in_both_clusters(pair):
    """Records come from both sides; the group consumes in east, which holds both, and resumes in west without
    missing west's own records (the RESPONSE marker travels behind them, as in Pulsar)."""
    east, west = pair
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, "app", PER_ROUND)
    for round_ in range(1, 5):
        produce(east.bootstrap, "orders", f"east{round_}", PER_ROUND, PARTITIONS)
        produce(west.bootstrap, "orders", f"west{round_}", PER_ROUND, PARTITIONS)
        time.sleep(0.3)
    total = 9 * PER_ROUND
    wait_for_records(east, "orders", PARTITIONS, total)
    wait_for_records(west, "orders", PARTITIONS, total)
    in_east += consume(east.bootstrap, "app", total // 2 - PER_ROUND)
    wait_for(lambda: west_position(west) >= total // 2 - 2 * PER_ROUND, 20, "the group's updates in west")
    east.kill()
    consumed = in_east + consume(west.bootstrap, "app", None)
    everything = {f"{side}{r}:{i}".encode() for side, rounds in (("east", range(5)), ("west", range(1, 5)))
                  for r in rounds for i in range(PER_ROUND)}
    assert set(consumed) == everything  # nothing missed, west's own records included
    assert len(consumed) - total <= 2 * PER_ROUND


@pytest.mark.slow  # 10-12 s: two clusters, kills and group consumers
def test_records_the_other_cluster_has_not_sent_yet_are_not_skipped_by_a_failover(pair):
    """west's own records that east has not received yet (west -> east is cut) must not be covered by a snapshot:
    west answers east's requests with a RESPONSE marker that waits behind them, so no update can move the group in
    west past records it never consumed in east. (Answering straight away, as a one-way standby does, would.)"""
    east, west = pair
    admin_json(east, "groups", "set-replicated", "app", "--enable")
    produce(east.bootstrap, "orders", "east0", PER_ROUND, PARTITIONS)
    in_east = consume(east.bootstrap, "app", PER_ROUND)
    west_admin = AdminClient(west.admin_url)
    west_admin.post(cluster_resource("east"), {"brokerServiceUrl": f"127.0.0.1:{free_port()}"})  # west -> east cut
    produce(west.bootstrap, "orders", "west1", PER_ROUND, PARTITIONS)
    for round_ in range(1, 4):  # data in east, so east asks for snapshots while west's records are held back
        produce(east.bootstrap, "orders", f"east{round_}", PER_ROUND, PARTITIONS)
        time.sleep(0.3)
    in_east += consume(east.bootstrap, "app", 3 * PER_ROUND)  # everything east holds: none of west1
    time.sleep(1)  # ten snapshot periods: any snapshot that could complete has
    assert sum(end_offsets(east, "orders", PARTITIONS).values()) == 4 * PER_ROUND  # control: west1 held back
    west_admin.post(cluster_resource("east"), {"brokerServiceUrl": east.bootstrap})
    wait_for_records(east, "orders", PARTITIONS, 5 * PER_ROUND)
    time.sleep(1)
    east.kill()
    consumed = in_east + consume(west.bootstrap, "app", None)
    assert {f"west1:{i}".encode() for i in range(PER_ROUND)} <= set(consumed)
