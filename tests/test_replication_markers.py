"""Geo-replication in real in-process brokers: PIP-33 markers another cluster's replicator stores here (an UPDATE
stored the moment its topic appears, before the replicators' first check, still moves the group; an UPDATE never
moves a group back past a commit of its own still being written), snapshot ticks of all partitions at once, and the
message TTL a replicator honours."""
import asyncio
import uuid
from types import SimpleNamespace

import pytest

from integration.idem_raw import RawKafka
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
EAST_TOPIC = uuid.uuid4()  # the id of east's topic, whose entries east's replicator stores here


@pytest.fixture
async def brokers(tmp_path):
    started = Brokers(str(tmp_path / "data"))
    yield started
    await started.stop_all()


def update_marker(group: str, cluster: str, position, covered: tuple[str, ...] = ()) -> bytes:
    payload = ReplicatedSubscriptionsUpdate(subscription_name=group, clusters=[
        ClusterMessageId(cluster=cluster, message_id=message_id(position))], covered_clusters=covered)
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


async def store_update(partition, group: str, position, source_entry: int, covered: tuple[str, ...] = ()):
    """An UPDATE marker for `group` stored as east's replicator stores it; where it was stored."""
    header, view = split_batches(update_marker(group, "west", position, covered))[0]
    source = MessageMetadata(producer_name="pulsar.marker", marker_type=UPDATE)
    stored = await partition.publish_replicated("east", EAST_TOPIC, 1, source_entry, source, header, view)
    assert stored.error == ErrorCode.NONE and not stored.duplicate
    return stored.position


async def test_an_update_whose_commit_failed_is_retried_in_log_order_and_the_cursor_moves_on(brokers):
    """The offset store fails (the partition's cursor log, where group offsets are written, fails its next
    flushes): the first UPDATE is not applied at once; it is tried again with a pause, in this run, and the next
    UPDATE (another group's) waits behind it. Then the `pulsar.updates` cursor records both."""
    west, partition, first = await west_with_data(brokers)
    second = partition.ledger.last_confirmed
    commits: list[tuple[str, int]] = []
    real_commit = west.groups.commit

    def recorded(group, topic, index, offset, *args, **kwargs):  # the order the updates reach the offset store
        commits.append((group, offset))
        return real_commit(group, topic, index, offset, *args, **kwargs)

    west.groups.commit = recorded
    partition.ledger.inject_cursor_write_failures(3)
    await store_update(partition, "a", first, 0)
    stored = await store_update(partition, "b", second, 1)
    await until(lambda: west.groups.fetch_offset("b", "orders", 0) is not None, seconds=10)
    assert west.replication.updates.failures >= 1  # control: the offset store did fail
    assert west.groups.fetch_offset("a", "orders", 0).offset == 2
    assert west.groups.fetch_offset("b", "orders", 0).offset == 5
    first_b = commits.index(("b", 5))
    assert commits[:first_b] and set(commits[:first_b]) == {("a", 2)}, commits  # a's attempts, then b's
    await west.replication.updates.settled(partition)
    assert partition.ledger.cursors["pulsar.updates"].mark_delete_position == stored


async def test_groups_updates_create_read_the_partition_from_its_start_once_across_a_restart(brokers):
    """A group an UPDATE creates is held before the first record here that the snapshot did not cover, looked for
    from the start of the partition. That reading is kept (and stored with the `pulsar.updates` cursor): the next
    groups created, before or after a restart, read only what was added since."""
    west = await brokers.start(cluster_name="west")
    partition = (await west.topics.create("orders", 1, {})).partition(0)
    east_records = 40
    for i in range(east_records):  # east's records: covered by east's snapshots
        header, view = batch(b"east%d" % i)
        source = MessageMetadata(producer_name="p")
        assert (await partition.publish_replicated("east", EAST_TOPIC, 1, i, source, header, view)).error == 0
    end = partition.ledger.last_confirmed
    entry = east_records
    for group in ("g1", "g2", "g3"):
        await store_update(partition, group, end, entry, covered=("east",))
        entry += 1
    await west.replication.updates.settled(partition)
    assert [west.groups.fetch_offset(g, "orders", 0).offset for g in ("g1", "g2", "g3")] == [east_records] * 3
    reading = west.replication.updates.from_the_start
    assert reading.entries_read == east_records - 1  # up to the last entry, once: not once per group
    own = await partition.publish_normal(*batch(b"west's own"))  # not covered: east never had it
    await partition.publish_replicated("east", EAST_TOPIC, 1, entry, MessageMetadata(producer_name="p"),
                                       *batch(b"east after"))
    entry += 1
    after = partition.ledger.last_confirmed
    await store_update(partition, "g4", after, entry, covered=("east",))
    entry += 1
    await west.replication.updates.settled(partition)
    assert west.groups.fetch_offset("g4", "orders", 0).offset == own.base_offset  # held before west's own record
    west = await brokers.restart(west)
    partition = west.topics.get("orders").partition(0)
    await store_update(partition, "g5", after, entry, covered=("east",))
    await until(lambda: west.groups.fetch_offset("g5", "orders", 0) is not None)
    assert west.groups.fetch_offset("g5", "orders", 0).offset == own.base_offset
    assert west.replication.updates.from_the_start.entries_read == 0  # what was read came back with the cursor


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


def batches_fetched(port: int, offset: int, max_bytes: int) -> list[int]:
    """The base offsets of the batches one Fetch (the request's and the partition's limit max_bytes) returns."""
    with RawKafka(port) as kafka:
        error, _, records = kafka.fetch_once("orders", 0, offset, max_bytes)
    assert error == ErrorCode.NONE
    return [header.base_offset for header, _ in split_batches(records)] if records else []


async def test_markers_take_nothing_of_a_fetchs_byte_limit(brokers):
    """A consumer whose max.partition.fetch.bytes holds three batches gets three, however many markers lie among
    them: their bytes are not the consumer's (a replicated topic with little traffic holds several markers per
    batch, which used to cut what each fetch returned down to its first batch)."""
    west = await brokers.start(cluster_name="west")
    partition = (await west.topics.create("orders", 1, {})).partition(0)
    sizes = []
    for i in range(6):
        header, view = batch(bytes([i]) * 1000)
        sizes.append(len(view))
        assert (await partition.publish_normal(header, view)).error == ErrorCode.NONE
        for _ in range(2):  # each about as large as a batch
            marker = await partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, b"m" * 900)
            assert marker.error == ErrorCode.NONE
    three = sum(sizes[:3])
    assert [e.span for e in partition.read(0, 1 << 20)] == [1, 0, 0] * 6  # control: the markers are there
    assert await asyncio.to_thread(batches_fetched, west.port, 0, three) == [0, 1, 2]
    assert await asyncio.to_thread(batches_fetched, west.port, 3, three - 1) == [3, 4]  # the third does not fit
    assert await asyncio.to_thread(batches_fetched, west.port, 3, 1 << 20) == [3, 4, 5]


async def test_a_replicator_does_not_send_records_older_than_the_message_ttl(tmp_path):
    """Pulsar's replicator drops expired entries (checklist 32): a record older than the topic's message TTL stays
    in east but is not sent to west; a younger one is. The replicator reads the entries' publish times against a
    clock it is given, set between the two records' times."""
    east_brokers, west_brokers = Brokers(str(tmp_path / "east")), Brokers(str(tmp_path / "west"))
    try:
        east = await east_brokers.start(cluster_name="east")
        west = await west_brokers.start(cluster_name="west")
        await west.clusters.create(check_cluster("east", f"127.0.0.1:{east.port}"))
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
