"""A compacted topic's cleaning settings, parsed from its configs with Kafka's defaults."""
from dataclasses import dataclass

LONG_MAX = 2**63 - 1
# Kafka's defaults (log.cleaner.delete.retention.ms, ...), also what DescribeConfigs reports
DEFAULTS = {"delete.retention.ms": "86400000", "min.compaction.lag.ms": "0", "max.compaction.lag.ms": str(LONG_MAX),
            "min.cleanable.dirty.ratio": "0.5"}


@dataclass(frozen=True)
class CompactionSettings:
    delete_retention_ms: int  # tombstones stay this long after their ledger closed
    min_lag_ms: int  # a ledger is cleanable once it closed this long ago ...
    max_lag_ms: int  # ... and cleaned, whatever the dirty ratio, once its oldest dirty ledger closed this long ago
    min_dirty_ratio: float  # cleaned when dirty bytes / cleanable bytes reach this

    @classmethod
    def parse(cls, configs: dict[str, str]) -> "CompactionSettings":
        value = {key: configs.get(key, default) for key, default in DEFAULTS.items()}
        return cls(int(value["delete.retention.ms"]), int(value["min.compaction.lag.ms"]),
                   int(value["max.compaction.lag.ms"]), float(value["min.cleanable.dirty.ratio"]))


def check(key: str, value: str) -> str | None:
    """What is wrong with a compaction config's value, None if nothing."""
    try:
        number = float(value) if key == "min.cleanable.dirty.ratio" else int(value)
    except (TypeError, ValueError):
        return f"{key} must be a number, got {value!r}"
    if key == "min.cleanable.dirty.ratio":
        return None if 0 <= number <= 1 else f"{key} must be between 0 and 1, got {value}"
    if key == "max.compaction.lag.ms":
        return None if number >= 1 else f"{key} must be at least 1, got {value}"
    return None if number >= 0 else f"{key} must be at least 0, got {value}"
