"""Kafka producer sequence numbers as monotonic int64 values.

Kafka sequences are int32 and continue at 0 after 2**31 - 1. PIP-6 compares int64 ids with `<=`, which would call
the first batch after the wrap a duplicate, so each producer's sequences are unwrapped to the int64 value closest to
the last one known for it: 2**31 - 1, then 0 becomes 2**31.
"""

from __future__ import annotations

SEQUENCE_MODULUS = 2**31
MAX_SEQUENCE = SEQUENCE_MODULUS - 1
_HALF = SEQUENCE_MODULUS // 2


def unwrap(sequence: int, near: int | None) -> int:
    """The non-negative int64 congruent to the wire `sequence` (mod 2**31) closest to `near`.

    With nothing known (`near is None`) the wire value is taken as is.
    """
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise ValueError(f"sequence {sequence} is not a Kafka sequence number")
    if near is None:
        return sequence
    value = near + (sequence - near + _HALF) % SEQUENCE_MODULUS - _HALF
    # Before the first lap there is nothing to be close to; such a value is ahead, not behind.
    return value if value >= 0 else value + SEQUENCE_MODULUS


def to_wire(value: int) -> int:
    """The int32 sequence a monotonic value stands for."""
    return value % SEQUENCE_MODULUS
