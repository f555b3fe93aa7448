"""Entry positions, as Pulsar addresses them: (ledgerId, entryId)."""
from typing import NamedTuple


class Position(NamedTuple):
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


# The position "before the first entry" of an empty managed ledger: a cursor there has consumed nothing.
BEFORE_FIRST = Position(-1, -1)
