"""Failures the demo and the tests inject into pipeline jobs, as stages placed just before the sink, so the sink has
written part of a task's rows when the task dies (what Spark's retries then write again)."""
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame

# Rows reach the sink in Arrow batches of this many: small, so a failing task has handed part of its rows to the sink.
FAULT_BATCH_ROWS = 25
FAULT_SPARK_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": str(FAULT_BATCH_ROWS)}
SETTLE_S = 1.0  # before failing, let the sink's producer send what it was handed


class InjectedTaskFailure(RuntimeError):
    """Raised on purpose; Spark retries the task."""


@dataclass(frozen=True)
class Faults:
    """fail_after_rows: the first attempt of every task fails after passing this many rows to the sink (0: never).
    row_delay_s: each row waits this long (slows a job down so a driver or broker can be killed mid-job)."""
    fail_after_rows: int = 0
    row_delay_s: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.fail_after_rows or self.row_delay_s)


def with_faults(rows: DataFrame, faults: Faults) -> DataFrame:
    if not faults:
        return rows
    return rows.mapInArrow(_fault_stage(faults), rows.schema)


def _fault_stage(faults: Faults) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        failing = faults.fail_after_rows > 0 and TaskContext.get().attemptNumber() == 0
        passed = 0
        for batch in batches:
            for start in range(0, batch.num_rows, FAULT_BATCH_ROWS):
                chunk = batch.slice(start, FAULT_BATCH_ROWS)
                if failing and passed + chunk.num_rows > faults.fail_after_rows:
                    time.sleep(SETTLE_S)
                    raise InjectedTaskFailure(f"task {TaskContext.get().partitionId()} fails on purpose after "
                                              f"{passed} rows")
                time.sleep(faults.row_delay_s * chunk.num_rows)
                passed += chunk.num_rows
                yield chunk
    return stage
