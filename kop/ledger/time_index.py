"""The batch timestamps of one ledger, for ListOffsets by time (Kafka's time index, kept in memory).

Per entry: its batch's max timestamp, read from the v2 batch header (no decompression), and the running maximum of
those up to it. The running maximum never falls, so the first entry holding a timestamp >= T (in offset order) is the
first whose running maximum reaches T: a binary search. The current ledger's index grows with its appends; a ledger
recovered from disk builds its index on first use, off the event loop (see LedgerFile.read_time_index).
"""
import struct
from array import array
from bisect import bisect_left

from protocol.records import MAX_TIMESTAMP_OFFSET

NO_TIMESTAMP = -1
_BELOW_ANY = -(1 << 63)
_INT64 = struct.Struct(">q")
TIMESTAMP_END = MAX_TIMESTAMP_OFFSET + _INT64.size  # batch header bytes needed to read its max timestamp


def batch_max_timestamp(data: bytes | memoryview) -> int:
    """maxTimestamp of the record batch `data` (from its header), NO_TIMESTAMP if data is too short to hold one."""
    if len(data) < TIMESTAMP_END:
        return NO_TIMESTAMP
    return _INT64.unpack_from(data, MAX_TIMESTAMP_OFFSET)[0]


class TimeIndex:
    def __init__(self) -> None:
        self.timestamps = array("q")  # each entry's batch max timestamp
        self.running_max = array("q")  # max of timestamps[0..i]

    def append(self, timestamp: int) -> None:
        previous = self.running_max[-1] if self.running_max else _BELOW_ANY
        self.timestamps.append(timestamp)
        self.running_max.append(max(previous, timestamp))

    def truncate(self, entries: int) -> None:
        del self.timestamps[entries:]
        del self.running_max[entries:]

    def max_until(self, last: int) -> int:
        """The greatest timestamp of entries 0..last, NO_TIMESTAMP when there are none."""
        return max(self.running_max[last], NO_TIMESTAMP) if last >= 0 else NO_TIMESTAMP

    def max_between(self, first: int, last: int) -> int:
        if first == 0:
            return self.max_until(last)
        return max(max(self.timestamps[first:last + 1], default=NO_TIMESTAMP), NO_TIMESTAMP)

    def first_at_least(self, timestamp: int, first: int, last: int) -> int:
        """The first entry of first..last whose batch holds a timestamp >= `timestamp`, or -1."""
        if last < first:
            return -1
        if first == 0 or self.running_max[first - 1] < timestamp:
            found = bisect_left(self.running_max, timestamp, first, last + 1)
            return found if found <= last else -1
        # An entry before `first` already reached it (first is mid-ledger after DeleteRecords): look one by one.
        return next((i for i in range(first, last + 1) if self.timestamps[i] >= timestamp), -1)
