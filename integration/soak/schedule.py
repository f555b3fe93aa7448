"""The seeded fault schedule: which fault, when, for how long. The same seed and length give the same plan."""
from __future__ import annotations

import random
from dataclasses import dataclass

# (shortest, longest) seconds each kind lasts; pauses reach past the clients' session and request timeouts (and a
# cluster's 3 s leases). A kind not named has its family's (the part before "_": kill_owner lasts as kill).
DURATIONS = {"cut": (1.0, 6.0), "kill": (0.0, 2.0), "pause": (2.0, 12.0), "disk_full": (2.0, 8.0),
             "dedup_flip": (0.5, 3.0), "cursor_fail": (1.0, 4.0), "torn_write": (1.0, 4.0), "full_disk_restart": (0.5, 3.0),
             "pg_restart": (0.5, 4.0), "link_down": (1.0, 10.0), "link_lossy": (1.0, 6.0)}
GAP = (1.0, 6.0)  # quiet seconds between faults, so clients make progress between them


@dataclass(frozen=True, slots=True)
class Step:
    at: float  # seconds from the start
    kind: str
    duration: float

    def __str__(self) -> str:
        return f"{self.at:7.1f}s {self.kind:<10} {self.duration:4.1f}s"


def duration_range(kind: str) -> tuple[float, float]:
    return DURATIONS.get(kind) or DURATIONS[kind.split("_", 1)[0]]


def plan(seed: int, seconds: float, kinds: list[str]) -> list[Step]:
    """Faults one after another, never overlapping, all ending before `seconds` (the last part is left quiet so
    the clients can finish what the faults held up)."""
    rng = random.Random(seed)
    steps, at, end = [], rng.uniform(*GAP), seconds * 0.85
    while True:
        kind = rng.choice(kinds)
        duration = round(rng.uniform(*duration_range(kind)), 1)
        if at + duration > end:
            return steps
        steps.append(Step(round(at, 1), kind, duration))
        at += duration + rng.uniform(*GAP)
