"""What one partition knows of transactions: the first offset of each producer's open transaction (the last stable
offset is the oldest of them) and the index of aborted transactions a read_committed fetch lists, so a fetch never
scans the log.

Both are updated when an entry is handed to the ledger (in offset order), and rebuilt from the ledger when the
partition loads: transactional batches open a transaction, control batches (COMMIT/ABORT markers) close it. An
aborted transaction is listed as Kafka's transaction index lists it: (producer id, first offset, marker offset, the
last stable offset once it was aborted); the last is what lets a lookup stop early."""
import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from kop.ledger import ManagedLedger
from protocol.records import control_marker, iter_records, split_batches

REBUILD_READ_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int  # the partition's LSO right after the abort: no later abort starts before it


class PartitionTransactions:
    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[AbortedTxn] = []  # in marker order
        self._aborted_ends: list[int] = []  # their last offsets, for bisect

    def on_data(self, producer_id: int, base_offset: int) -> None:
        """A transactional batch was appended at base_offset."""
        self.open.setdefault(producer_id, base_offset)

    def on_marker(self, producer_id: int, offset: int, commit: bool, high_watermark: int) -> None:
        """A COMMIT or ABORT marker of producer_id was appended at offset."""
        first = self.open.pop(producer_id, None)
        if first is None or commit:
            return  # a marker for a transaction with no data here (or written again after a failure)
        self.aborted.append(AbortedTxn(producer_id, first, offset, self.last_stable_offset(max(high_watermark,
                                                                                               offset + 1))))
        self._aborted_ends.append(offset)

    def last_stable_offset(self, high_watermark: int) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        return min(min(self.open.values(), default=high_watermark), high_watermark)

    def oldest_open_offset(self) -> int | None:
        return min(self.open.values(), default=None)

    def aborted_between(self, fetch_offset: int, upper: int) -> Iterator[AbortedTxn]:
        """Aborted transactions a fetch returning [fetch_offset, upper) must list: their marker at or after
        fetch_offset and their first offset below upper."""
        for txn in self.aborted[bisect.bisect_left(self._aborted_ends, fetch_offset):]:
            if txn.first_offset < upper:
                yield txn
            if txn.last_stable_offset >= upper:
                return

    def forget_before(self, offset: int) -> None:
        """Retention deleted everything below offset: aborted transactions that ended there are no longer needed."""
        cut = bisect.bisect_left(self._aborted_ends, offset)
        if cut:
            del self.aborted[:cut]
            del self._aborted_ends[:cut]

    def rebuild(self, ledger: ManagedLedger) -> int:
        """Read every stored batch's header (and each marker's one record) to rebuild the state; returns how many
        entries were read."""
        self.open, self.aborted, self._aborted_ends = {}, [], []
        offset, end, read = ledger.start_index, ledger.confirmed_end_index, 0
        while offset < end:
            entries = ledger.read_from_index(offset, REBUILD_READ_BYTES)
            if not entries:
                break
            for entry in entries:
                for header, view in split_batches(entry.data):
                    if not header.is_transactional:
                        continue
                    if header.is_control:
                        marker = control_marker(next(iter_records(view)))
                        self.on_marker(header.producer_id, header.base_offset, marker.commit,
                                       header.base_offset + 1)
                    else:
                        self.on_data(header.producer_id, header.base_offset)
                read += 1
            offset = entries[-1].first_index + entries[-1].span
        return read
