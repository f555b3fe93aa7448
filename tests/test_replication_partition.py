"""Geo-replication where it meets a partition over the real file ledger: replicated entries are stored once per
source position, also after the partition is reopened (the watermark is rebuilt from the log); markers cover no
Kafka offset; the PIP-33 snapshot controller runs one round with one remote and two with more, ignores late and
repeated answers, drops snapshots that time out, and writes an UPDATE once a replicated group's offset passes a
completed snapshot."""
from __future__ import annotations

import asyncio
import uuid

from dedup import DedupConfig, Status
from dedup.named_sequences import core_name
from kop.client.sequences import sequence_headers
from kop.dedup_storage import LedgerDedupStorage
from kop.groups.offsets import OFFSET_KEY, REPLICATED_KEY
from kop.ledger import FileManagedLedger, LedgerConfig, Position
from kop.partition import PartitionLog, replicator_name, source_position_key
from kop.producer_ids import TAG_SHIFT, cluster_tag
from kop.replication.snapshots import SnapshotController, SnapshotSettings
from proto.kop_pb2 import (MarkerType, MessageMetadata, NamedSequence, ReplicatedSubscriptionsSnapshot,
                           ReplicatedSubscriptionsUpdate)
from protocol.errors import ErrorCode
from protocol.records import (Record, build_batch, build_marker_batch, iter_records, marker_payload, split_batches,
                              validate_batch)
from protocol.sequence_headers import SequenceHeaderScan

TOPIC_ID = uuid.UUID(int=7)  # the source topic's id: one incarnation of it
SETTINGS = SnapshotSettings(frequency_s=0.1, timeout_s=30, max_cached=3)


async def open_partition(directory) -> PartitionLog:
    ledger = FileManagedLedger.open("t-partition-0", str(directory), LedgerConfig(), None)
    partition = PartitionLog("t", 0, ledger, DedupConfig())
    await partition.apply_dedup_policy(True)
    return partition


def batch(*values: bytes):
    records = [Record(offset=i, timestamp=1_000 + i, key=None, value=v) for i, v in enumerate(values)]
    return split_batches(build_batch(records))[0]


async def replicate(partition: PartitionLog, entry_id: int, *values: bytes, topic_id: uuid.UUID = TOPIC_ID):
    header, view = batch(*values)
    return await partition.publish_replicated("east", topic_id, 3, entry_id, MessageMetadata(producer_name="p"),
                                              header, view)


def markers(partition: PartitionLog) -> list[tuple[int, MessageMetadata, bytes]]:
    out = []
    for entry in partition.ledger.read_after(Position(-1, -1), 1000):
        metadata = MessageMetadata.FromString(entry.metadata)
        if metadata.HasField("marker_type"):
            out.append((metadata.marker_type, metadata, marker_payload(entry.data)[1]))
    return out


async def test_replicated_entries_are_stored_once_per_source_position_across_a_reopen(tmp_path):
    partition = await open_partition(tmp_path)
    first = await replicate(partition, 0, b"a", b"b")
    assert first.error == ErrorCode.NONE and not first.duplicate
    assert (await replicate(partition, 0, b"a", b"b")).duplicate
    assert not (await replicate(partition, 1, b"c")).duplicate
    await partition.close()
    partition = await open_partition(tmp_path)
    assert (await replicate(partition, 1, b"c")).duplicate  # the watermark was rebuilt from the log
    assert (await replicate(partition, 0, b"a", b"b")).duplicate
    assert partition.high_watermark == 3
    assert partition.dedup.persisted[replicator_name("east", TOPIC_ID)] == source_position_key(3, 1)
    stored = MessageMetadata.FromString(partition.read(0, 1 << 20)[0].metadata)
    assert stored.replicated_from == "east" and stored.original_producer_name == "p"
    await partition.close()


async def test_a_recreated_source_topic_is_stored_after_the_old_one_whose_positions_it_reuses(tmp_path):
    partition = await open_partition(tmp_path)
    assert not (await replicate(partition, 0, b"a")).duplicate
    assert not (await replicate(partition, 1, b"b")).duplicate
    recreated = uuid.UUID(int=8)
    assert not (await replicate(partition, 0, b"c", topic_id=recreated)).duplicate  # same position, new topic
    assert (await replicate(partition, 0, b"c", topic_id=recreated)).duplicate
    assert (await replicate(partition, 1, b"b")).duplicate  # the old incarnation keeps its own watermark
    await partition.close()
    partition = await open_partition(tmp_path)
    assert (await replicate(partition, 0, b"c", topic_id=recreated)).duplicate
    assert [bytes(r.value) for e in partition.read(0, 1 << 20) for r in iter_records(e.data)] == [b"a", b"b", b"c"]
    await partition.close()


async def test_markers_cover_no_offset(tmp_path):
    partition = await open_partition(tmp_path)
    header, view = batch(b"a", b"b")
    await partition.publish_normal(header, view)
    marker = await partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, b"x")
    header, view = batch(b"c")
    await partition.publish_normal(header, view)
    assert marker.error == ErrorCode.NONE and marker.position is not None
    assert partition.high_watermark == 3
    assert partition.ledger.position_of_index(2) != marker.position  # offset 2 is the data entry after it
    assert [e.span for e in partition.read(0, 1 << 20)] == [2, 0, 1]  # the fetch path drops span-0 entries
    assert await partition.ledger.find_by_timestamp(1_000, 0) is not None
    await partition.close()


async def test_a_consumers_read_leaves_markers_out_of_its_entries_and_its_byte_limit(tmp_path):
    partition = await open_partition(tmp_path)
    await check_markers_left_out_of_reads(partition)
    await partition.close()


async def check_markers_left_out_of_reads(partition: PartitionLog) -> None:
    """Four batches, three markers after each (together larger than a batch): read_records serves the batches
    within its limit as if the markers were not there (the PostgreSQL engine's tests run it too)."""
    sizes = []
    for i in range(4):
        header, view = batch(bytes([i]) * 500)
        sizes.append(len(view))
        await partition.publish_normal(header, view)
        for _ in range(3):
            await partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, b"m" * 400)
    two = sizes[0] + sizes[1]
    assert [e.first_index for e in partition.read_records(0, two)] == [0, 1]
    assert [e.first_index for e in partition.read_records(0, two, whole_first=False)] == [0, 1]
    assert [e.first_index for e in partition.read_records(1, two - 1, whole_first=False)] == [1]
    assert [e.first_index for e in partition.read_records(0, sizes[0] - 1)] == [0]  # KIP-74: the first, whole
    assert partition.read_records(0, sizes[0] - 1, whole_first=False) == []  # not in a response's later partition
    assert [e.first_index for e in partition.read_records(2, 1 << 20)] == [2, 3]  # the markers at the end: no more
    assert len(partition.read(0, 1 << 20)) == 16  # control: the markers are stored among the batches


async def until(condition, seconds: float = 5.0) -> None:
    """Let background writes (a marker written from an answer) land; bounded."""
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def _with_group(partition: PartitionLog, offset: int) -> None:
    cursor = partition.ledger.open_cursor("app")
    await cursor.mark_delete(partition.ledger.last_confirmed, {OFFSET_KEY: offset, REPLICATED_KEY: 1})


async def test_two_rounds_with_two_remotes_then_an_update(tmp_path):
    partition = await open_partition(tmp_path)
    header, view = batch(b"a", b"b")
    await partition.publish_normal(header, view)
    await _with_group(partition, 0)
    controller = SnapshotController(partition, "a", lambda: ["b", "c"], lambda _remote: True, SETTINGS)
    await controller.tick(now=0)
    [(snapshot_id, pending)] = controller.pending.items()
    assert pending.rounds == 2
    here = partition.ledger.last_confirmed  # where the answers landed (a position the partition holds)
    controller.received_response(snapshot_id, "b", Position(11, 11), here)
    controller.received_response(snapshot_id, "b", Position(99, 99), here)  # repeated: ignored
    controller.received_response(snapshot_id, "c", Position(22, 22), here)
    assert pending.round == 2 and pending.missing == {"b", "c"}
    await until(lambda: len(markers(partition)) == 2)  # the second round's request
    here = partition.ledger.last_confirmed
    controller.received_response(snapshot_id, "b", Position(33, 33), here)
    controller.received_response(snapshot_id, "c", Position(44, 44), here)
    await until(lambda: controller.completed_count == 1)
    assert not controller.pending
    kinds = [kind for kind, _, _ in markers(partition)]
    assert kinds.count(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST) == 2
    [(_, metadata, payload)] = [m for m in markers(partition) if m[0] == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT]
    assert list(metadata.replicate_to) == ["a"]  # never replicated
    snapshot = ReplicatedSubscriptionsSnapshot.FromString(payload)
    assert {(c.cluster, c.message_id.ledger_id) for c in snapshot.clusters} == {("b", 11), ("c", 22)}  # round 1
    assert list(snapshot.covered_clusters) == ["a", "b", "c"]  # both answered with RESPONSE markers
    assert not [m for m in markers(partition) if m[0] == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE]  # offset 0
    await _with_group(partition, 2)
    await controller.tick(now=2)
    [(_, _, payload)] = [m for m in markers(partition) if m[0] == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE]
    update = ReplicatedSubscriptionsUpdate.FromString(payload)
    assert update.subscription_name == "app" and len(update.clusters) == 2
    assert list(update.covered_clusters) == ["a", "b", "c"]
    await controller.tick(now=3)  # the same snapshot is not sent twice
    assert len([m for m in markers(partition) if m[0] == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE]) == 1
    await partition.close()


async def test_snapshots_time_out_are_taken_again_and_then_wait_for_data(tmp_path):
    """A snapshot whose answer was lost is taken again without new data (traffic may have stopped for good); once
    one completes, the next waits for data."""
    partition = await open_partition(tmp_path)
    header, view = batch(b"a")
    await partition.publish_normal(header, view)
    await _with_group(partition, 1)
    controller = SnapshotController(partition, "a", lambda: ["b"], lambda _remote: True, SETTINGS)
    await controller.tick(now=0)
    [snapshot_id] = controller.pending
    await controller.tick(now=10)  # pending, none completed yet, no new data: nothing new
    assert list(controller.pending) == [snapshot_id]
    await controller.tick(now=31)  # timed out, and taken again at once
    assert controller.timed_out_count == 1
    [again] = controller.pending
    assert again != snapshot_id
    controller.received_response(snapshot_id, "b", Position(1, 1), partition.ledger.last_confirmed)  # late: ignored
    assert controller.completed_count == 0
    controller.received_response(again, "b", Position(2, 2), partition.ledger.last_confirmed, in_band=True)
    await until(lambda: controller.completed_count == 1)
    [stored] = [ReplicatedSubscriptionsSnapshot.FromString(p) for kind, _, p in markers(partition)
                if kind == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT]
    assert list(stored.covered_clusters) == ["a"]  # b answered in its response (one way): its records are not
    updates = lambda: [ReplicatedSubscriptionsUpdate.FromString(p).subscription_name  # noqa: E731
                       for kind, _, p in markers(partition) if kind == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE]
    await until(lambda: updates() == ["app"])  # the group's position went out (written just after the completion)
    await controller.tick(now=32)  # no data since the snapshot that completed: no snapshot
    assert not controller.pending
    unreachable = SnapshotController(partition, "a", lambda: ["b"], lambda _remote: False, SETTINGS)
    await unreachable.tick(now=0)
    assert not unreachable.pending
    await partition.close()


async def complete_snapshot(partition: PartitionLog, controller: SnapshotController, now: float, *values: bytes):
    """New data, then a snapshot round that the one remote answers."""
    header, view = batch(*values)
    await partition.publish_normal(header, view)
    done = controller.completed_count
    await controller.tick(now=now)
    [snapshot_id] = controller.pending
    controller.received_response(snapshot_id, "b", Position(int(now), 0), partition.ledger.last_confirmed)
    await until(lambda: controller.completed_count == done + 1)


def updates(partition: PartitionLog) -> list[int]:
    """The remote ledger ids the UPDATE markers carry (complete_snapshot answers with the tick's time)."""
    return [ReplicatedSubscriptionsUpdate.FromString(payload).clusters[0].message_id.ledger_id
            for kind, _, payload in markers(partition) if kind == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE]


async def test_a_group_far_behind_the_newest_data_keeps_snapshots_it_can_still_pass(tmp_path):
    """Ten snapshots complete while the group sits at offset 0, three cached at most: the group keeps three spread
    over what it has to consume, so committing part of the way replicates its position."""
    partition = await open_partition(tmp_path)
    header, view = batch(b"start")
    await partition.publish_normal(header, view)
    await _with_group(partition, 0)
    controller = SnapshotController(partition, "a", lambda: ["b"], lambda _remote: True, SETTINGS)
    for second in range(1, 11):  # snapshot k covers offsets up to k + 1
        await complete_snapshot(partition, controller, second, f"r{second}".encode())
    assert updates(partition) == []
    assert controller.to_json()["cachedSnapshots"] == 3
    await _with_group(partition, 6)  # halfway: passes snapshots 1-5, none of the newest three
    await controller.tick(now=11)
    [passed] = updates(partition)
    assert 1 <= passed <= 5
    await _with_group(partition, 11)  # the head
    await controller.tick(now=12)
    assert updates(partition)[1:] == [10]
    await controller.tick(now=13)  # sent once
    assert len(updates(partition)) == 2
    await partition.close()


def sequenced_batch(ids: range):
    """Records `i` that carry the application producer name `loader` and sequence id i."""
    records = [Record(offset=n, timestamp=1_000, key=None, value=str(i).encode(),
                      headers=tuple(sequence_headers("loader", i))) for n, i in enumerate(ids)]
    return split_batches(build_batch(records))[0]


async def test_replicated_records_already_written_here_under_their_sequence_ids_are_dropped(tmp_path):
    """A producer failed over and wrote ids 0-2 here before east's entries with 0-3 and 0-1 arrived: 3 is stored,
    the rest not again; an entry whose records are all here still counts as stored by its source position."""
    partition = await open_partition(tmp_path)
    header, view = sequenced_batch(range(3))
    await partition.publish_normal(header, view, records=validate_batch(header, view, watch=SequenceHeaderScan))
    source = MessageMetadata(producer_name="p", named_sequences=[NamedSequence(name=core_name("loader"),
                                                                               sequence_id=3)])
    header, view = sequenced_batch(range(4))
    stored = await partition.publish_replicated("east", TOPIC_ID, 3, 0, source, header, view)
    assert stored.error == ErrorCode.NONE and not stored.duplicate
    header, view = sequenced_batch(range(2))
    source.named_sequences[0].sequence_id = 1
    assert not (await partition.publish_replicated("east", TOPIC_ID, 3, 1, source, header, view)).duplicate
    assert partition.sequences.dropped == 5
    assert [bytes(r.value) for e in partition.read(0, 1 << 20) for r in iter_records(e.data)] == [b"0", b"1", b"2",
                                                                                                   b"3"]
    assert partition.high_watermark == 3 + 4 + 2  # the dropped records leave holes
    assert partition.last_sequence_id("loader") == 3
    await partition.close()
    partition = await open_partition(tmp_path)
    assert (await partition.publish_replicated("east", TOPIC_ID, 3, 1, source, header, view)).duplicate
    assert partition.last_sequence_id("loader") == 3
    await partition.close()


async def test_a_replicated_marker_counts_in_the_watermark_rebuilt_after_a_crash(tmp_path):
    """Markers from this cluster stay out of the deduplication state, but a replicated one holds its source position:
    a REQUEST resent after the target crashed must be found stored, not stored twice."""
    crashed = await open_partition(tmp_path)
    header, view = split_batches(build_marker_batch(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, b"x"))[0]
    source = MessageMetadata(producer_name="pulsar.marker",
                             marker_type=MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST)
    assert not (await crashed.publish_replicated("east", TOPIC_ID, 3, 0, source, header, view)).duplicate
    # no close (a crash): no snapshot of the deduplication state, it is rebuilt from the log
    partition = await open_partition(tmp_path)
    assert (await partition.publish_replicated("east", TOPIC_ID, 3, 0, source, header, view)).duplicate
    await partition.close()
    await crashed.close()


async def test_replicated_entries_wait_while_the_deduplication_state_is_recovered(tmp_path, monkeypatch):
    """A recovery that failed leaves the watermark unknown: a resend is refused (the replicator sends it again) until
    the state is whole, then found stored."""
    partition = await open_partition(tmp_path)
    assert not (await replicate(partition, 0, b"a")).duplicate
    await partition.close()
    replay = LedgerDedupStorage.replay_after
    failures = [OSError("read error during replay")]

    async def fails_once(self, position):
        if failures:
            raise failures.pop()
        async for entry in replay(self, position):
            yield entry

    monkeypatch.setattr(LedgerDedupStorage, "replay_after", fails_once)
    ledger = FileManagedLedger.open("t-partition-0", str(tmp_path), LedgerConfig(), None)
    partition = PartitionLog("t", 0, ledger, DedupConfig(recovery_retry_seconds=0))
    assert await partition.apply_dedup_policy(True) is Status.FAILED  # control: the recovery failed
    refused = await replicate(partition, 0, b"a")
    assert refused.error == ErrorCode.REQUEST_TIMED_OUT
    assert await partition.dedup.check_status(True) is Status.ENABLED  # the retry the refusal started
    assert (await replicate(partition, 0, b"a")).duplicate
    assert partition.high_watermark == 1
    await partition.close()


def producer_batch(producer_id: int, base_sequence: int, *values: bytes):
    records = [Record(offset=i, timestamp=1_000 + i, key=None, value=v) for i, v in enumerate(values)]
    return split_batches(build_batch(records, producer_id=producer_id, producer_epoch=0,
                                     base_sequence=base_sequence))[0]


async def test_a_replicated_batch_of_a_shared_producer_id_is_that_producers_batch_here_across_a_reopen(tmp_path):
    """Dedup V1 for Kafka producers: west stores east's replicated batch of producer P (an id east handed out) as
    P's batch, so P's resend of it here, after it failed over keeping its id, is a duplicate, also once the state
    is rebuilt from the log; P may go on here past a gap (what east has not sent yet)."""
    def shared(partition: PartitionLog) -> PartitionLog:
        partition.shared_producer_ids.update(["east", "west"])
        return partition

    pid = cluster_tag("east") << TAG_SHIFT | 5
    partition = shared(await open_partition(tmp_path))
    header, view = producer_batch(pid, 0, b"a", b"b")
    source = MessageMetadata(producer_name=f"kafka-{pid}-0", producer_id=pid, producer_epoch=0)
    assert not (await partition.publish_replicated("east", TOPIC_ID, 3, 0, source, header, view)).duplicate
    resent = await partition.publish_normal(*producer_batch(pid, 0, b"a", b"b"))
    assert resent.error == ErrorCode.NONE and resent.base_offset == 0 and partition.high_watermark == 2
    await partition.close()
    partition = shared(await open_partition(tmp_path))  # P's state rebuilt from the replicated entry
    assert (await partition.publish_normal(*producer_batch(pid, 0, b"a", b"b"))).base_offset == 0
    assert (await replicate(partition, 0, b"a", b"b")).duplicate  # the source position was rebuilt too
    ahead = await partition.publish_normal(*producer_batch(pid, 7, b"h"))  # 2-6 are still on their way from east
    assert ahead.error == ErrorCode.NONE and ahead.base_offset == 2
    header, view = producer_batch(pid, 7, b"h")  # east's copy of it, after the producer's own: dropped
    assert not (await partition.publish_replicated("east", TOPIC_ID, 3, 1, source, header, view)).duplicate
    header, view = producer_batch(pid, 2, b"c")  # records P wrote in east before the gap: kept
    assert not (await partition.publish_replicated("east", TOPIC_ID, 3, 2, source, header, view)).duplicate
    stored = [bytes(r.value) for e in partition.read(0, 1 << 20) for r in iter_records(e.data)]
    assert stored == [b"a", b"b", b"h", b"c"]
    await partition.close()
    # control: where the ids are not shared (two clusters of one tag, say), the same resend is stored again
    plain = await open_partition(tmp_path / "plain")
    header, view = producer_batch(pid, 0, b"a", b"b")
    assert not (await plain.publish_replicated("east", TOPIC_ID, 3, 0, source, header, view)).duplicate
    assert (await plain.publish_normal(*producer_batch(pid, 0, b"a", b"b"))).base_offset == 2
    await plain.close()


def test_markers_keep_pulsars_types_and_field_numbers():
    """Checklist 31: PulsarMarkers.proto's enum values and field numbers, so the payloads mean the same thing."""
    from proto import kop_pb2
    pulsar_types = {"UNKNOWN_MARKER": 0, "REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST": 10,
                    "REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE": 11, "REPLICATED_SUBSCRIPTION_SNAPSHOT": 12,
                    "REPLICATED_SUBSCRIPTION_UPDATE": 13}
    assert {name: MarkerType.Value(name) for name in pulsar_types} == pulsar_types
    pulsar = {"ReplicatedSubscriptionsSnapshotRequest": {"snapshot_id": 1, "source_cluster": 2},
              "ReplicatedSubscriptionsSnapshotResponse": {"snapshot_id": 1, "cluster": 2},
              "ReplicatedSubscriptionsSnapshot": {"snapshot_id": 1, "local_message_id": 2, "clusters": 3},
              "ReplicatedSubscriptionsUpdate": {"subscription_name": 1, "clusters": 2},
              "ClusterMessageId": {"cluster": 1, "message_id": 2},
              "MarkersMessageIdData": {"ledger_id": 1, "entry_id": 2}}
    for message, fields in pulsar.items():
        descriptor = getattr(kop_pb2, message).DESCRIPTOR
        assert {name: descriptor.fields_by_name[name].number for name in fields} == fields, message


async def test_a_marker_is_the_marker_producers_and_never_touches_the_deduplication_state(tmp_path):
    """Checklist 31 and 7: a marker's metadata names the producer `pulsar.marker` with sequence id 0, and the
    deduplication maps do not see it."""
    partition = await open_partition(tmp_path)
    await partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, b"x")
    [(kind, metadata, payload)] = markers(partition)
    assert (kind, metadata.producer_name, metadata.sequence_id, payload) == \
        (MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST, "pulsar.marker", 0, b"x")
    assert "pulsar.marker" not in partition.dedup.pushed and "pulsar.marker" not in partition.dedup.persisted
    await partition.close()


async def test_a_snapshot_completes_only_once_its_snapshot_marker_is_durable(tmp_path):
    """Checklist 37 (Pulsar #26119): the last answer came, but the SNAPSHOT marker's write fails: the snapshot stays
    pending, sends no UPDATE, and times out to be taken again."""
    partition = await open_partition(tmp_path)
    await partition.publish_normal(*batch(b"a", b"b"))
    await _with_group(partition, 2)
    controller = SnapshotController(partition, "a", lambda: ["b"], lambda _remote: True, SETTINGS)
    await controller.tick(now=0)
    [snapshot_id] = controller.pending
    partition.ledger.inject_write_failures(1)
    controller.received_response(snapshot_id, "b", Position(11, 11), partition.ledger.last_confirmed)
    await asyncio.gather(*controller._writes)
    assert controller.completed_count == 0 and snapshot_id in controller.pending
    assert not [m for m in markers(partition) if m[0] == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT]
    await controller.tick(now=SETTINGS.timeout_s + 1)
    assert controller.timed_out_count == 1 and snapshot_id not in controller.pending
    assert not [m for m in markers(partition) if m[0] == MarkerType.REPLICATED_SUBSCRIPTION_UPDATE]
    await partition.close()
