"""PIP-33 markers between real brokers, read back from the stopped brokers' ledgers: with
`enableReplicatedSubscriptions=false` no marker is written and no group follows; with three clusters a RESPONSE reaches
its requester alone (its `replicate_to`), never the third cluster; and retention deletes ledgers that hold markers
without disturbing offsets, the group's failover, or a restart that reads the stored snapshots again."""
import asyncio
import os
import time

import pytest

from integration.geo import replicate_everywhere, start_clusters, topic_stats, wait_for, wait_for_records
from integration.idem_raw import RawKafka
from integration.test_admin import admin_json
from integration.test_geo_failover import FAST_SNAPSHOTS, consume, west_position
from integration.test_geo_replication import produce
from kop.ledger import FileManagedLedger, LedgerConfig, Position
from kop.topic_storage import ledger_name
from proto.kop_pb2 import MarkerType, MessageMetadata

PARTITIONS = 2
RESPONSE = MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE
pytestmark = [pytest.mark.file_storage(reason="reads the stopped brokers' ledger files"),
              pytest.mark.slow]  # 15-45 s each: two or three clusters, snapshot rounds, restarts


def stored_markers(broker, topic: str) -> list[MessageMetadata]:
    """The markers a stopped broker's partitions of `topic` hold, read from its ledger files."""
    async def read() -> list[MessageMetadata]:
        found = []
        for partition in range(PARTITIONS):
            name = ledger_name(topic, partition)
            ledger = FileManagedLedger.open(name, os.path.join(broker.data_dir, "ledgers", "public", "default", name),
                                            LedgerConfig(), None)
            try:
                position = Position(-1, -1)
                while entries := ledger.read_after(position, 1000):
                    found += [m for e in entries
                              if (m := MessageMetadata.FromString(e.metadata)).HasField("marker_type")]
                    position = entries[-1].position
            finally:
                await ledger.close()
        return found
    return asyncio.run(read())


@pytest.fixture
def started(tmp_path):
    brokers = {}

    def start(names, config):
        brokers.update(start_clusters(tmp_path, names, {**FAST_SNAPSHOTS, **config}))
        replicate_everywhere(brokers, "orders", PARTITIONS)
        return brokers

    yield start
    for broker in brokers.values():
        broker.stop()


def group_consumes_in(broker, rounds: int, per_round: int = 20) -> int:
    """The group `app`, flagged replicated, consumes `rounds` rounds of records produced in `broker`."""
    admin_json(broker, "groups", "set-replicated", "app", "--enable")
    for round_ in range(rounds):
        produce(broker.bootstrap, "orders", f"r{round_}", per_round, PARTITIONS)
        assert len(consume(broker.bootstrap, "app", per_round)) == per_round
    return rounds * per_round


def test_with_replicated_subscriptions_off_no_marker_is_written_and_no_group_follows(started):
    brokers = started(("east", "west"), {"enableReplicatedSubscriptions": "false"})
    east, west = brokers["east"], brokers["west"]
    total = group_consumes_in(east, 3)
    wait_for_records(west, "orders", PARTITIONS, total)  # control: records replicate
    assert admin_json(east, "groups", "get-replicated", "app") is True  # control: the group is flagged
    time.sleep(1.0)  # ten snapshot periods
    assert "app" not in topic_stats(west, "orders")["subscriptions"]
    for broker in (east, west):
        broker.stop()
    assert stored_markers(east, "orders") == [] and stored_markers(west, "orders") == []


def test_a_response_reaches_its_requester_alone_never_a_third_cluster(started):
    brokers = started(("a", "b", "c"), {})
    total = group_consumes_in(brokers["a"], 3)
    wait_for(lambda: sum(p["replicatedSubscriptionSnapshots"]["completedSnapshots"]
                         for p in topic_stats(brokers["a"], "orders")["partitions"].values()) >= 2 * PARTITIONS,
             30, "snapshots in a, answered by b and c")
    for broker in brokers.values():
        wait_for_records(broker, "orders", PARTITIONS, total)
        broker.stop()
    responses = {name: [m for m in stored_markers(broker, "orders") if m.marker_type == RESPONSE]
                 for name, broker in brokers.items()}
    for name, stored in responses.items():
        for marker in stored:
            if marker.replicated_from:  # received: addressed here
                assert list(marker.replicate_to) == [name], (name, marker)
            else:  # its own answer, to another cluster
                assert len(marker.replicate_to) == 1 and marker.replicate_to[0] != name, (name, marker)
    # control: b and c answered a, and a got both answers
    assert {m.replicated_from for m in responses["a"]} >= {"b", "c"}
    assert all(any(not m.replicated_from and list(m.replicate_to) == ["a"] for m in responses[name])
               for name in ("b", "c"))


def test_retention_deletes_ledgers_with_markers_and_the_group_still_fails_over(started):
    brokers = started(("east", "west"), {"log.retention.ms": "1000", "log.retention.check.interval.ms": "200"})
    east, west = brokers["east"], brokers["west"]
    first = group_consumes_in(east, 3)
    wait_for(lambda: west_position(west) == first, 30, "the group's position in west")

    def ends(broker) -> tuple[int, int]:
        with RawKafka(broker.port) as kafka:
            return (sum(kafka.start_offsets("orders", range(PARTITIONS)).values()),
                    sum(kafka.end_offsets("orders", range(PARTITIONS)).values()))

    wait_for(lambda: ends(east) == (first, first), 30, "retention to delete the records and markers east holds")
    east.restart()  # the snapshot cache is read again from markers retention has partly deleted
    total = first + group_consumes_in(east, 2)
    assert ends(east)[1] == total  # markers took no offset
    wait_for(lambda: west_position(west) == total, 30, "the group's new position in west")
    again = consume(west.bootstrap, "app", None, timeout=10)
    assert again == []  # nothing left to consume there: the group failed over at its end
