"""Small statistics for benchmark figures: percentiles, medians, and per-round ratios of two variants."""
import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (fraction in 0..1) of values; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def paired_ratios(variant: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """variant[i] / baseline[i] for each round i: rounds ran side by side, so the ratio cancels the machine's drift."""
    return [v / b for v, b in zip(variant, baseline) if b]


def interleaved_order(count: int, round_index: int) -> list[int]:
    """Variant indexes for one round: forward on even rounds, backward on odd ones (ABBA), so no variant always runs
    first (a cold cache) or last (a warm one)."""
    order = list(range(count))
    return order if round_index % 2 == 0 else order[::-1]
