"""The broker's clock for its own timers over wall-clock time (ledger rolls by age, time retention, transaction
timeouts): the wall clock read once at start-up, advanced by the monotonic clock. A jump of the system clock while
the broker runs (NTP stepping it, an operator setting it) then neither rolls, deletes and aborts en masse (forward)
nor stalls them (backward); the next start reads the wall clock as it is. Record timestamps (LogAppendTime) stay
the system's wall clock, as Kafka's are."""
import time

_WALL_AT_START = time.time()
_MONOTONIC_AT_START = time.monotonic()


def now_ms() -> int:
    """Milliseconds since the epoch, as the wall clock read at start-up and the monotonic time since."""
    return int((_WALL_AT_START + time.monotonic() - _MONOTONIC_AT_START) * 1000)
