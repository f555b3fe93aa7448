"""What the log cleaner has done to one partition: shown in the admin API's partition stats."""
from dataclasses import dataclass


@dataclass
class CleanerStats:
    """One partition's cleaning, as stats and metrics show it."""

    dirty_ratio: float = 0.0
    lag_ms: int = 0  # how long the oldest uncleaned closed ledger has waited
    runs: int = 0
    last_run_ms: int = -1
    records_removed: int = 0
    tombstones_removed: int = 0
    aborted_removed: int = 0  # records of aborted transactions
    bytes_reclaimed: int = 0
    cleaned_through_ledger: int = -1

    def as_json(self) -> dict:
        return {"dirtyRatio": round(self.dirty_ratio, 4), "lagMs": self.lag_ms, "runs": self.runs,
                "lastRunMs": self.last_run_ms, "recordsRemoved": self.records_removed,
                "tombstonesRemoved": self.tombstones_removed, "abortedRecordsRemoved": self.aborted_removed,
                "bytesReclaimed": self.bytes_reclaimed, "cleanedThroughLedger": self.cleaned_through_ledger}
