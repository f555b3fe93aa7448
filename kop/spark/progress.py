"""Progress on the console while Spark jobs run: the active stages' finished tasks, polled from Spark's status
tracker in a background thread and drawn with rich."""
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

POLL_S = 0.25


@contextmanager
def spark_progress(spark: SparkSession, description: str, console: Console | None = None) -> Iterator[None]:
    """Show `description` with the task progress of whatever stages run inside the block."""
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(description, total=None)
        finished: dict[int, tuple[int, int]] = {}  # stage id -> (completed, all) tasks, of stages seen running

        def poll() -> None:
            while not done.wait(POLL_S):
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        finished[stage_id] = (info.numCompletedTasks, info.numTasks)
                completed = sum(c for c, _ in finished.values())
                progress.update(task, completed=completed, total=sum(t for _, t in finished.values()) or None)

        poller = threading.Thread(target=poll, name="spark-progress", daemon=True)
        poller.start()
        try:
            yield
        finally:
            done.set()
            poller.join()
            total = sum(t for _, t in finished.values())
            progress.update(task, completed=total, total=total or 1)
