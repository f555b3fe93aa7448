"""Application-chosen sequence ids on the PIP-6 core (Pulsar's producer name + `setSequenceId`): each record that
carries a producer name and a sequence id of the application's choosing is judged on its own, under that name, on
its partition, whatever producer sent it. An id at or below the highest stored for the name is a duplicate and the
record is dropped; gaps are allowed.

A batch is judged in two steps, with no `await` between them and its write: `judge_records` decides every record
without changing anything (a record whose name has a higher id still in flight makes the whole batch undecidable:
PIP-6's Unknown), then `commit` pushes the names of the records kept. A name's records in one batch are judged
against the state before the batch and against each other, in order. `judge_run` is the same judgement for the
usual batch, a producer's next records under one name with rising ids: one look at the state decides it when they
are all new, and it gives up (None) otherwise, for `judge_records` to decide record by record.

Names live apart from Kafka producers' (`NAME_PREFIX`), in the same maps, snapshots, purge and cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dedup.message_deduplication import DupStatus, MessageDeduplication

NAME_PREFIX = "app:"
_NOT_DUP = DupStatus.NOT_DUP  # an enum member lookup costs more than the rest of judging a run, once per batch


def core_name(producer_name: str) -> str:
    """The name the core keeps an application producer name under."""
    return NAME_PREFIX + producer_name


def application_name(name: str) -> str | None:
    """The application producer name a core name stands for, or None for a Kafka producer's."""
    return name[len(NAME_PREFIX):] if name.startswith(NAME_PREFIX) else None


@dataclass(slots=True)  # not frozen: built per batch, and a frozen dataclass costs ~3.5x to build
class RecordsDecision:
    """What to store of a batch: the records to keep (indexes, in order), the duplicates dropped, and per core name
    the highest id kept (what `commit` pushes, and what the entry records for a replay). `unknown` names a producer
    whose higher id is still being written: nothing is decided, the batch must come again."""

    keep: Sequence[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    highest: dict[str, int] = field(default_factory=dict)
    unknown: str | None = None


def judge_records(dedup: MessageDeduplication, records: Sequence[tuple[str | None, int | None]]) -> RecordsDecision:
    """Decide each record `(producer name, sequence id)`; `(None, None)` is a record without them, always kept."""
    decision = RecordsDecision()
    keep, dropped, highest = decision.keep, decision.dropped, decision.highest
    for index, (name, sequence_id) in enumerate(records):
        if name is None:
            keep.append(index)
            continue
        key = NAME_PREFIX + name
        before = highest.get(key)
        if before is not None:
            if sequence_id <= before:  # a record before it in this batch has it already
                dropped.append(index)
                continue
        else:
            status = dedup.judge(key, sequence_id)
            if status is DupStatus.DUP:
                dropped.append(index)
                continue
            if status is DupStatus.UNKNOWN:
                return RecordsDecision(unknown=name)
        highest[key] = sequence_id
        keep.append(index)
    return decision


def strictly_rising(ids: list[int]) -> bool:
    """Whether each id is above the one before (quick for consecutive ids, the rule)."""
    if not ids:
        return True
    first, last = ids[0], ids[-1]
    if last - first == len(ids) - 1:  # the rule: consecutive ids
        return ids == list(range(first, last + 1))
    return ids == sorted(set(ids))


def judge_run(dedup: MessageDeduplication, name: str, ids: Sequence[int], count: int,
              rising: bool | None = None) -> RecordsDecision | None:
    """What `judge_records` decides for a batch of `count` records whose records with the headers all carry `name`
    with `ids` (a list, or a range with `rising`), if they rise strictly (`rising`, when the caller knows) and the
    first is new: every record kept, the name's highest id the last. None otherwise (some may be duplicates, or in
    flight): judge them one by one."""
    if not (rising if rising is not None else strictly_rising(ids)):
        return None
    key = NAME_PREFIX + name
    if dedup.judge(key, ids[0]) is not _NOT_DUP:
        return None
    return RecordsDecision(range(count), [], {key: ids[-1]})  # positional: half the cost, once per batch


def commit(dedup: MessageDeduplication, decision: RecordsDecision) -> None:
    """The batch is being written: its names' ids are pushed."""
    for name, sequence_id in decision.highest.items():
        dedup.push(name, sequence_id)
