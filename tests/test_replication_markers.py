"""Geo-replication in real in-process brokers: PIP-33 markers another cluster's replicator stores here (an UPDATE
stored the moment its topic appears, before the replicators' first check, still moves the group; an UPDATE never
moves a group back past a commit of its own still being written), snapshot ticks of all partitions at once, and the
message TTL a replicator honours."""
import asyncio
import uuid
from types import SimpleNamespace

import pytest

from kop.broker import Broker
from kop.replication.clusters import check_cluster
from kop.replication.link import RemoteLink
from kop.replication.replicator import Replicator
from kop.replication.snapshots import message_id
from proto.kop_pb2 import ClusterMessageId, MarkerType, MessageMetadata, ReplicatedSubscriptionsUpdate
from protocol.errors import ErrorCode
from protocol.records import build_marker_batch, iter_records, split_batches
from tests.test_groups_coordinator import Brokers
from tests.test_replication_partition import batch, until

pytestmark = pytest.mark.timeout(30)
UPDATE = MarkerType.REPLICATED_SUBSCRIPTION_UPDATE


@pytest.fixture
async def brokers(tmp_path):
    started = Brokers(str(tmp_path / "data"))
    yield started
    await started.stop_all()


def update_marker(group: str, cluster: str, position) -> bytes:
    payload = ReplicatedSubscriptionsUpdate(subscription_name=group, clusters=[
        ClusterMessageId(cluster=cluster, message_id=message_id(position))])
    return build_marker_batch(UPDATE, payload.SerializeToString())


async def west_with_data(brokers: Brokers) -> tuple[Broker, object, object]:
    """West, a topic `orders` with records 0-1 then 2-4; the first entry's position."""
    west = await brokers.start(cluster_name="west")
    topic = await west.topics.create("orders", 1, {})
    partition = topic.partition(0)
    first = await partition.publish_normal(*batch(b"a", b"b"))
    assert (await partition.publish_normal(*batch(b"c", b"d", b"e"))).error == ErrorCode.NONE
    return west, partition, first.position


async def test_an_update_stored_before_the_first_check_of_the_replicators_moves_the_group(brokers):
    west = await brokers.start(cluster_name="west")
    west.replication._task.cancel()  # the check runs every 0.5 s: here it has not run since the topic appeared
    topic = await west.topics.create("orders", 1, {})
    partition = topic.partition(0)
    first = await partition.publish_normal(*batch(b"a", b"b"))
    header, view = split_batches(update_marker("app", "west", first.position))[0]
    source = MessageMetadata(producer_name="pulsar.marker", marker_type=UPDATE)
    stored = await partition.publish_replicated("east", uuid.uuid4(), 1, 0, source, header, view)
    assert stored.error == ErrorCode.NONE and not stored.duplicate
    await until(lambda: west.groups.fetch_offset("app", "orders", 0) is not None)
    assert west.groups.fetch_offset("app", "orders", 0).offset == 2


async def test_an_update_never_moves_a_group_back_past_a_commit_still_being_written(brokers):
    west, partition, first = await west_with_data(brokers)
    committing = west.groups.commit("app", "orders", 0, 5)  # not durable yet when the update is handled
    metadata = MessageMetadata(producer_name="pulsar.marker", marker_type=UPDATE, replicated_from="east")
    west.replication._on_marker(partition, metadata, update_marker("app", "west", first), partition.ledger.last_confirmed)
    assert await committing == ErrorCode.NONE
    await west.replication.updates.settled(partition)  # the update was handled, and anything it wrote landed
    assert west.groups.fetch_offset("app", "orders", 0).offset == 5
    # control: with no commit of its own, the same update moves the group
    west.replication._on_marker(partition, metadata, update_marker("other", "west", first),
                                partition.ledger.last_confirmed)
    await until(lambda: west.groups.fetch_offset("other", "orders", 0) is not None)
    assert west.groups.fetch_offset("other", "orders", 0).offset == 2


async def test_the_snapshot_ticks_of_every_partition_run_at_once(brokers):
    """Each partition's tick waits for its markers' fsync: run one after the other, the real period would grow with
    the number of partitions. Here every tick is held until all have started."""
    west = await brokers.start(cluster_name="west", replicated_subscriptions_snapshot_frequency_millis=50)
    west.replication._task.cancel()  # no check of the replicators: it would drop the stand-ins below
    started: set[str] = set()
    release = asyncio.Event()

    class HeldTick:  # stands for a partition's controller whose tick waits for a slow disk
        def __init__(self, name: str) -> None:
            self.partition = SimpleNamespace(name=name)

        async def tick(self) -> None:
            started.add(self.partition.name)
            await release.wait()

    west.replication.controllers = {(f"t{i}", 0): HeldTick(f"t{i}-0") for i in range(20)}
    try:
        await until(lambda: len(started) == 20)
    finally:
        release.set()


async def test_a_replicator_does_not_send_records_older_than_the_message_ttl(tmp_path):
    """Pulsar's replicator drops expired entries (checklist 32): a record older than the topic's message TTL stays
    in east but is not sent to west; a younger one is. The replicator reads the entries' publish times against a
    clock it is given, set between the two records' times."""
    east_brokers, west_brokers = Brokers(str(tmp_path / "east")), Brokers(str(tmp_path / "west"))
    try:
        east = await east_brokers.start(cluster_name="east")
        west = await west_brokers.start(cluster_name="west")
        west.clusters.create(check_cluster("east", f"127.0.0.1:{east.port}"))
        partition = (await east.topics.create("orders", 1, {})).partition(0)
        await partition.publish_normal(*batch(b"old"))
        await asyncio.sleep(0.02)  # the second record's publish time is later
        await partition.publish_normal(*batch(b"young"))
        times = [MessageMetadata.FromString(e.metadata).publish_time for e in partition.read(0, 1 << 20)]
        assert times[1] - times[0] >= 10
        link = RemoteLink(check_cluster("west", f"127.0.0.1:{west.port}"), "east")
        replicator = Replicator(partition, uuid.uuid4().bytes, lambda: 1, "east", "west", lambda: link,
                                lambda *_: None, message_ttl_s=lambda: 60, now_ms=lambda: times[1] + 60_000 - 5)
        try:
            for _ in range(10):
                if not await replicator._step():
                    break
        finally:
            await link.close()
        assert replicator.stats.entries_expired == 1 and replicator.stats.entries_sent == 1
        copied = west.topics.get("orders").partition(0)
        values = [bytes(r.value) for e in copied.read(0, 1 << 20) for r in iter_records(e.data)]
        assert values == [b"young"]
        assert [bytes(r.value) for e in partition.read(0, 1 << 20) for r in iter_records(e.data)] == \
            [b"old", b"young"]  # expired for replication only: east keeps it
    finally:
        await east_brokers.stop_all()
        await west_brokers.stop_all()
