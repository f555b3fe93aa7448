"""Geo-replication reads the partition in bounded steps: a replicator's step, and the snapshot cache's rebuild at
load, read at most about 1 MB at a time (the first entry whatever its size), so a partition of large batches is
never pulled into memory hundreds of MB at once on the event loop."""
import uuid

import pytest

from kop.ledger import Position
from kop.partition import PartitionLog
from kop.replication.link import LinkError
from kop.replication.replicator import Replicator
from kop.replication.snapshots import SnapshotController, message_id
from proto.kop_pb2 import ClusterMessageId, MarkerType, ReplicatedSubscriptionsSnapshot
from protocol.records import Record, build_batch, split_batches
from tests.test_replication_partition import SETTINGS, _with_group, open_partition

BIG = 200_000  # bytes per record: 30 of them are 6 MB
STEP_BYTES = 1 << 20  # what one step may read, past its first entry


async def fill(partition: PartitionLog, count: int) -> None:
    for i in range(count):
        header, view = split_batches(build_batch([Record(offset=0, timestamp=1_000, key=None,
                                                         value=bytes([i % 256]) * BIG)]))[0]
        assert (await partition.publish_normal(header, view)).error == 0


def watch_reads(partition: PartitionLog) -> list[int]:
    """The bytes each read_after of the partition's ledger returned (a spy: the reads themselves are real)."""
    sizes: list[int] = []
    read_after = partition.ledger.read_after

    def counted(*args, **kwargs):
        entries = read_after(*args, **kwargs)
        sizes.append(sum(len(e.data) for e in entries))
        return entries

    partition.ledger.read_after = counted
    return sizes


async def test_a_replicator_step_reads_about_one_request_of_bytes(tmp_path):
    partition = await open_partition(tmp_path)
    await fill(partition, 30)
    sizes = watch_reads(partition)
    replicator = Replicator(partition, uuid.uuid4().bytes, lambda: 1, "east", "west", lambda: None,
                            lambda *_: None)
    with pytest.raises(LinkError):  # no link to send on: the step stops after its read
        await replicator._step()
    assert sizes, "the step read nothing"
    assert max(sizes) <= STEP_BYTES + BIG + 1024
    assert replicator.cursor.mark_delete_position < partition.ledger.last_confirmed  # control: not all was sent
    await partition.close()


async def test_the_snapshot_cache_rebuild_reads_in_bounded_steps_and_finds_every_snapshot(tmp_path):
    partition = await open_partition(tmp_path)
    await fill(partition, 15)
    stored = []
    for n in range(3):  # three completed snapshots stored among the data
        local = partition.ledger.last_confirmed
        payload = ReplicatedSubscriptionsSnapshot(snapshot_id=f"s{n}", local_message_id=message_id(local), clusters=[
            ClusterMessageId(cluster="west", message_id=message_id(Position(9, n)))])
        await partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT, payload.SerializeToString(),
                                       replicate_to=("east",))
        stored.append(f"s{n}")
        await fill(partition, 5)
    await _with_group(partition, 0)
    sizes = watch_reads(partition)
    controller = SnapshotController(partition, "east", lambda: ["west"], lambda _remote: True, SETTINGS)
    await controller._rebuild(0)
    assert len(sizes) > 3 and max(sizes) <= STEP_BYTES + BIG + 1024
    assert sorted(s.snapshot_id for s in controller.recent) == stored  # control: the scan read everything
    await partition.close()
