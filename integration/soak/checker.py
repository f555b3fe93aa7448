"""The soak's verdict, per client: acknowledged records lost, duplicates, order violations, acknowledged offsets
that are wrong, acknowledged records the group never received, partitions whose committed offset never reached the
end (a stuck consumer), and committed offsets that went backwards."""
from __future__ import annotations

from dataclasses import dataclass

from integration.idem_raw import StoredRecord
from integration.idem_stream import StreamCheck, check_stream
from integration.soak.producers import StreamProducer


@dataclass(frozen=True, slots=True)
class ClientVerdict:
    client: str
    stream: StreamCheck
    unreceived: int  # acknowledged, stored, and never delivered to the group
    stuck: list[int]  # partitions whose committed offset stayed behind the end
    backwards: list[tuple[int, int, int]]  # partition, from, to
    producer_error: str | None

    @property
    def ok(self) -> bool:
        s = self.stream
        return not (s.lost or s.duplicated or s.out_of_order or s.offset_mismatches or s.foreign or self.unreceived
                    or self.stuck or self.backwards or self.producer_error)

    def summary(self) -> str:
        return (f"{self.client:<13} {'ok  ' if self.ok else 'FAIL'} {self.stream.summary()} "
                f"unreceived={self.unreceived} stuck={self.stuck} backwards={self.backwards}"
                + (f" producer_error={self.producer_error}" if self.producer_error else ""))


def judge(producer: StreamProducer, stored: list[StoredRecord], received: set[bytes], committed: dict[int, int],
          ends: dict[int, int], backwards: list[tuple[int, int, int]]) -> ClientVerdict:
    stream = check_stream(producer.sent, producer.reports, stored)
    stored_values = {r.value for r in stored}
    unreceived = sum(1 for r in producer.reports if r.error is None and r.value in stored_values
                     and r.value not in received)
    stuck = sorted(p for p, end in ends.items() if committed.get(p, -1) < end)
    return ClientVerdict(producer.client, stream, unreceived, stuck, backwards,
                         None if producer.error is None else repr(producer.error))
