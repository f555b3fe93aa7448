"""What a person watching sees: a line per second and, on a terminal, a live progress bar under the lines; the summary
at the end. Nothing here runs in a thread of its own (the bar is redrawn at each sample), so the display never
competes with the measuring loop for the interpreter."""
from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kop.perf.stats import Latency, Sample, Totals


def latency_text(latency: Latency | None) -> str:
    if latency is None:
        return "latency ms  -"
    return (f"latency ms p50 {latency.p50:,.2f}  p95 {latency.p95:,.2f}  p99 {latency.p99:,.2f}  "
            f"max {latency.max:,.2f}")


def rate_text(records_per_s: float, mb_per_s: float) -> str:
    if math.isnan(records_per_s):
        return "- records/s"
    return f"{records_per_s:,.0f} records/s ({mb_per_s:,.2f} MB/s)"


class Display:
    def __init__(self, what: str, total: int | None, to_stderr: bool) -> None:
        self.console = Console(stderr=to_stderr, highlight=False)
        columns = [SpinnerColumn(), TextColumn(what)]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        else:
            columns += [TextColumn("{task.completed:,}")]
        self._progress = Progress(*columns, TimeElapsedColumn(), console=self.console, auto_refresh=False,
                                  transient=True)
        self._task = self._progress.add_task(what, total=total)

    def __enter__(self) -> Display:
        if self.console.is_terminal:  # elsewhere (a pipe, a file) only the lines are wanted
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress.live.is_started:
            self._progress.stop()

    def sample(self, sample: Sample, done: int) -> None:
        self._progress.console.print(
            f"{sample.time_s:7.1f} s  {rate_text(sample.records_per_s, sample.mb_per_s)}  "
            f"{latency_text(sample.latency)}  total {done:,}", markup=False, soft_wrap=True)
        self._progress.update(self._task, completed=done)
        self._progress.refresh()

    def warn(self, text: str) -> None:
        self._progress.console.print(f"[yellow]warning:[/] {escape(text)}", markup=True)

    def summary(self, title: str, totals: Totals, details: list[str]) -> None:
        latency = totals.latency
        lines = [f"{totals.records:,} records in {totals.seconds:,.2f} s: "
                 f"{rate_text(totals.records_per_s, totals.mb_per_s)}"]
        if latency is not None:
            lines.append(f"{latency_text(latency)}  p99.9 {latency.p999:,.2f}  mean {latency.mean:,.2f}")
        self.console.print(f"[bold]{title}[/]: " + escape("; ".join(lines + details)), markup=True, soft_wrap=True)
