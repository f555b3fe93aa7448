"""JSON views of partitions for the admin API, in the shape of Pulsar's topic stats and internal stats.

A Kafka topic T with N partitions is Pulsar's partitioned topic `persistent://{ns}/T` whose partitions are
`persistent://{ns}/T-partition-{i}`. Stats of T aggregate its partitions and list each under `partitions`, as
`pulsar-admin topics partitioned-stats --per-partition` does.
"""
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dedup.named_sequences import application_name
from dedup.sequences import to_wire
from kop.groups.offsets import CommittedOffset
from kop.partition import PartitionLog


def partition_topic_name(namespace: str, topic: str, partition: int) -> str:
    return f"persistent://{namespace}/{topic}-partition-{partition}"


def topic_name(namespace: str, topic: str) -> str:
    return f"persistent://{namespace}/{topic}"


def format_position(position: Sequence[int]) -> str:
    return f"{position[0]}:{position[1]}"


def publishers(partition: PartitionLog) -> list[dict]:
    """Kafka idempotent producers known to this partition's dedup state, with their last sequence ids.

    `lastSequenceId` is Pulsar's (the highest sequence id pushed, as a monotonic int64); `lastSequenceIdWire` is the
    int32 Kafka sequence it stands for. Names in the dedup maps with no Kafka producer state behind them (a write
    still in flight, or a name kept only in a snapshot) are listed by name alone. Application-chosen names
    (`kop.producer.name`) are not publishers: `named_sequences` counts them.
    """
    dedup, producers = partition.dedup, partition.producers
    out = []
    seen = set()
    for producer_id, state in sorted(producers.persisted_state().items()):
        name = producers.producer_name(producer_id, state.epoch)
        seen.add(name)
        out.append({
            "producerId": producer_id,
            "producerEpoch": state.epoch,
            "producerName": name,
            **_sequence_fields(dedup.last_sequence_id(name), dedup.persisted_sequence_id(name)),
            "recentBatches": [{"firstSequence": to_wire(b.first_seq), "lastSequence": to_wire(b.last_seq),
                               "baseOffset": b.base_offset, "lastOffset": b.last_offset} for b in state.batches],
        })
    for name in sorted(n for n in dedup.pushed if n not in seen and application_name(n) is None):
        out.append({"producerName": name,
                    **_sequence_fields(dedup.last_sequence_id(name), dedup.persisted_sequence_id(name))})
    return out


def _sequence_fields(last: int, persisted: int | None) -> dict:
    return {
        "lastSequenceId": last,
        "lastSequenceIdWire": to_wire(last) if last >= 0 else -1,
        "lastPersistedSequenceId": -1 if persisted is None else persisted,
    }


# The replication stats of a partition, per remote cluster (kop/replication/replicator.py `to_json`).
ReplicationView = Callable[[PartitionLog], Mapping[str, dict]]


@dataclass(frozen=True, slots=True)
class GroupView:
    """What the group coordinator knows of groups on a partition: their committed offsets (by topic and partition
    index) and which groups are geo-replicated. In a cluster the coordinator, not the partition, knows the offsets."""

    committed_on: Callable[[str, int], Mapping[str, CommittedOffset]]
    replicated: Collection[str]


def partition_stats(partition: PartitionLog, replication: ReplicationView, groups: GroupView) -> dict:
    stats = partition.ledger.internal_stats()
    return {
        "deduplicationStatus": partition.dedup.status.value,
        "publishers": publishers(partition),
        "storageSize": sum(l.size for l in stats.ledgers),
        "numberOfEntries": sum(l.entries for l in stats.ledgers),
        "logStartOffset": partition.log_start_offset,
        "highWatermark": partition.high_watermark,
        "namedSequences": named_sequences(partition),
        "subscriptions": subscriptions(partition, groups),
        "replication": dict(replication(partition)),
        "compaction": partition.cleaner_stats.as_json(),
    }


def subscriptions(partition: PartitionLog, groups: GroupView) -> dict:
    """The consumer groups with a committed offset on this partition, as Pulsar lists a topic's subscriptions: the
    offset and the backlog behind the partition's end (offsets, so records dropped as duplicates still count)."""
    end = partition.high_watermark
    return {group: {"type": "KafkaConsumerGroup", "committedOffset": committed.offset,
                    "msgBacklog": max(0, end - committed.offset), "lastCommitTimestamp": committed.commit_timestamp,
                    "isReplicated": group in groups.replicated}
            for group, committed in sorted(groups.committed_on(partition.topic, partition.partition).items())}


def named_sequences(partition: PartitionLog) -> dict:
    """Application-chosen sequence ids on this partition: how many names it knows, how many records it dropped as
    duplicates, and how many of those came from producers without idempotence (which can reorder on retry)."""
    return {"names": sum(1 for name in partition.dedup.persisted if application_name(name) is not None),
            "duplicatesDropped": partition.sequences.dropped,
            "droppedWithoutIdempotence": partition.sequences.dropped_without_idempotence}


def topic_stats(namespace: str, topic: str, partitions: Sequence[PartitionLog],
                replication: ReplicationView, group_view: GroupView) -> dict:
    """Aggregated stats of a topic plus each partition's own."""
    per_partition = {partition_topic_name(namespace, topic, p.partition): partition_stats(p, replication, group_view)
                     for p in partitions}
    statuses = {s["deduplicationStatus"] for s in per_partition.values()}
    by_producer: dict[str, dict] = {}
    for stats in per_partition.values():
        for publisher in stats["publishers"]:
            entry = by_producer.setdefault(publisher["producerName"], {
                k: publisher[k] for k in ("producerId", "producerEpoch", "producerName") if k in publisher})
            entry["partitions"] = entry.get("partitions", 0) + 1
    groups: dict[str, dict] = {}
    for partition in partitions:
        for group, stats in subscriptions(partition, group_view).items():
            entry = groups.setdefault(group, {"type": stats["type"], "msgBacklog": 0, "partitions": {},
                                              "isReplicated": stats["isReplicated"]})
            entry["msgBacklog"] += stats["msgBacklog"]
            entry["partitions"][str(partition.partition)] = {k: stats[k] for k in
                                                            ("committedOffset", "msgBacklog", "lastCommitTimestamp")}
    return {
        "metadata": {"partitions": len(partitions)},
        # One status when the partitions agree; they differ only for a moment while a policy change is applied.
        "deduplicationStatus": statuses.pop() if len(statuses) == 1 else "Mixed",
        "publishers": [by_producer[name] for name in sorted(by_producer)],
        "storageSize": sum(s["storageSize"] for s in per_partition.values()),
        "numberOfEntries": sum(s["numberOfEntries"] for s in per_partition.values()),
        "subscriptions": groups,
        "replication": _topic_replication(per_partition.values()),
        "partitions": per_partition,
    }


_SUMMED = ("replicationBacklog", "replicationBacklogBytes", "entriesReplicated", "duplicatesAtRemote",
           "entriesSkipped", "entriesExpired", "bytesReplicated")


def _topic_replication(per_partition) -> dict:
    """Per remote cluster: backlogs summed over the partitions, connected when all are, the latest error."""
    out: dict[str, dict] = {}
    for stats in per_partition:
        for remote, replicator in stats["replication"].items():
            entry = out.setdefault(remote, {**dict.fromkeys(_SUMMED, 0), "connected": True, "lastError": None,
                                            "lastErrorTimestamp": None})
            for key in _SUMMED:
                entry[key] += replicator[key]
            entry["connected"] = entry["connected"] and replicator["connected"]
            if (replicator["lastErrorTimestamp"] or 0) > (entry["lastErrorTimestamp"] or 0):
                entry["lastError"] = replicator["lastError"]
                entry["lastErrorTimestamp"] = replicator["lastErrorTimestamp"]
    return out


def partition_internal_stats(partition: PartitionLog) -> dict:
    """Pulsar's PersistentTopicInternalStats for one partition's managed ledger."""
    stats = partition.ledger.internal_stats()
    current = next((l for l in stats.ledgers if l.ledger_id == stats.current_ledger_id), None)
    return {
        "numberOfEntries": sum(l.entries for l in stats.ledgers),
        "totalSize": sum(l.size for l in stats.ledgers),
        "currentLedgerEntries": current.entries if current else 0,
        "currentLedgerSize": current.size if current else 0,
        "lastConfirmedEntry": format_position(stats.last_confirmed),
        "firstOffset": stats.start_index,
        "highWatermark": stats.confirmed_end_index,
        "state": "LedgerOpened",
        "ledgers": [{"ledgerId": l.ledger_id, "entries": l.entries, "size": l.size, "offloaded": False}
                    for l in stats.ledgers],
        "cursors": {c.name: {"markDeletePosition": format_position(c.mark_delete_position),
                             "properties": c.properties,
                             "stringProperties": c.string_properties}
                    for c in stats.cursors},
        "deduplicationStatus": partition.dedup.status.value,
        "transactionIndex": {  # kop's own: the aborted-transaction index of each ledger
            "storedLedgers": partition.ledger.txn_indexed_ledgers(),
            "abortedInMemory": {str(ledger_id): len(aborts)
                                for ledger_id, aborts in partition.transactions.indexes.in_memory().items()},
            "openTransactions": len(partition.transactions.open),
        },
    }


def topic_internal_stats(namespace: str, topic: str, partitions: Sequence[PartitionLog]) -> dict:
    """Pulsar's partitioned-internalStats shape: metadata plus each partition's internal stats."""
    return {
        "metadata": {"partitions": len(partitions)},
        "partitions": {partition_topic_name(namespace, topic, p.partition): partition_internal_stats(p)
                       for p in partitions},
    }


__all__ = ["partition_internal_stats", "partition_stats", "partition_topic_name", "publishers", "subscriptions",
           "topic_internal_stats", "topic_name", "topic_stats"]
