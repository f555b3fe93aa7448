"""Failures the demo and the tests inject into pipeline jobs. kop's writer carries them out (sink options), since
only the sink knows when a row is written: a task's first attempt fails once part of its rows are stored, and rows
can be slowed down so that a driver or broker is killed while a job writes."""
from dataclasses import dataclass

FAIL_AFTER_OPTION = "injectFailureAfterRecords"
ROW_DELAY_OPTION = "injectRecordDelayMs"


class InjectedTaskFailure(RuntimeError):
    """Raised on purpose; Spark retries the task."""


@dataclass(frozen=True)
class Faults:
    """fail_after_rows: the first attempt of every task stores this many rows, then fails (0: never).
    row_delay_ms: each row waits this long before it is written."""
    fail_after_rows: int = 0
    row_delay_ms: float = 0.0

    def sink_options(self) -> dict[str, str]:
        return {FAIL_AFTER_OPTION: str(self.fail_after_rows), ROW_DELAY_OPTION: str(self.row_delay_ms)}
