"""`kop perf produce|consume`: check the brokers and the topic, run the loop under the live display, then print the
summary and write the JSON and the chart. A PerfError at any point is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from kop.perf.cluster import prepare_topic
from kop.perf.consumer import run_consume
from kop.perf.display import Display
from kop.perf.options import ConsumeOptions, Output, PerfError, ProduceOptions
from kop.perf.plot import plot
from kop.perf.producer import run_produce
from kop.perf.report import redacted, sample_json, totals_json, write_json
from kop.perf.stats import Sample, Totals


@dataclass(frozen=True)
class Outcome:
    """One run as the reports need it."""

    samples: list[Sample]
    totals: Totals
    details: dict  # the command's own summary fields
    problem: str | None  # set: the run did not do all it was asked (exit status 1)


def _stop_on_sigterm(_signum, _frame) -> None:
    raise KeyboardInterrupt  # `timeout 60 kop perf ...` or a process manager: end as Ctrl-C does, with the summary


def run_perf(args: argparse.Namespace) -> int:
    prog = f"kop perf {args.perf_command}"
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        options = args.perf_options(args)
        run, title, latency_label = COMMANDS[args.perf_command]
        outcome = run(options)
        _write_outputs(args.perf_command, options, outcome, title, latency_label)
    except PerfError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if outcome.problem:
        print(f"{prog}: {outcome.problem}", file=sys.stderr)
        return 1
    return 0


def _display(options: ProduceOptions | ConsumeOptions, what: str, total: int | None) -> Display:
    return Display(what, total, to_stderr=options.output.json_path == "-")


def _produce(options: ProduceOptions) -> Outcome:
    prepare_topic(options.bootstrap_server, options.topic, options.client_config, options.partitions,
                  options.replication_factor, missing_hint=" (pass --partitions N to create it)")
    with _display(options, f"producing to {options.topic}", options.num_records) as display:
        result = run_produce(options, display)
        details = {"sent": result.sent, "failed": result.failed, "first_error": result.first_error,
                   "interrupted": result.interrupted}
        lines = [f"{result.sent:,} sent, {result.failed:,} failed"] + (["interrupted"] if result.interrupted else [])
        display.summary("produce", result.totals, lines)
    problem = None
    if result.failed:
        problem = f"{result.failed:,} of {result.sent:,} records failed: {result.first_error}"
    return Outcome(result.samples, result.totals, details, problem)


def _consume(options: ConsumeOptions) -> Outcome:
    prepare_topic(options.bootstrap_server, options.topic, options.client_config)
    with _display(options, f"consuming from {options.topic}", options.messages) as display:
        result = run_consume(options, display)
        details = {"expected": result.expected, "assigned_after_s": result.assigned_after_s,
                   "timed_out": result.timed_out, "interrupted": result.interrupted,
                   "group": options.client_config.get("group.id")}
        joined = "never assigned partitions" if result.assigned_after_s is None else \
            f"partitions assigned after {result.assigned_after_s:.2f} s"
        lines = [joined] + (["interrupted"] if result.interrupted else [])
        display.summary("consume", result.totals, lines)
    problem = None
    if result.expected and result.totals.records < result.expected and not result.interrupted:
        why = f"no record for --timeout {options.idle_timeout_s:g} s" if result.timed_out else "--duration passed"
        problem = f"{result.totals.records:,} of {result.expected:,} records arrived ({why})"
    return Outcome(result.samples, result.totals, details, problem)


# command -> (run, chart title, latency name)
COMMANDS: dict[str, tuple[Callable, str, str]] = {
    "produce": (_produce, "kop perf produce", "send-to-ack latency"),
    "consume": (_consume, "kop perf consume", "end-to-end latency"),
}


def _write_outputs(command: str, options: ProduceOptions | ConsumeOptions, outcome: Outcome, title: str,
                   latency_label: str) -> None:
    output: Output = options.output
    try:
        if output.json_path:
            write_json(output.json_path, {
                "command": command,
                "options": {**dataclasses.asdict(options), "client_config": redacted(options.client_config)},
                "samples": [sample_json(s) for s in outcome.samples],
                "summary": {**totals_json(outcome.totals), **outcome.details}})
        if output.plot_path:
            plot(outcome.samples, f"{title} {options.topic}", latency_label, output.plot_path)
    except OSError as exc:
        raise PerfError(f"writing the results: {exc}") from None
