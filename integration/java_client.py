"""Runs the Java Kafka client harness (integration/java/) and turns its JSON lines into dataclasses.

Each helper starts one JVM running one harness program against a broker and returns what the official Apache Kafka
client saw. Client logs go to the process's stderr (level from KOP_JAVA_LOG, default warn) and are carried by
JavaClientError when a run fails.

Timeouts: `timeout` bounds the whole JVM process. The Java program gets a deadline of 75% of it, and the producer's
own timeouts (max.block.ms, request.timeout.ms, delivery.timeout.ms) default to fit inside that deadline, so a run
against a broken broker ends with reports rather than a killed process.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from integration import java_harness

# Small heap and the serial collector: these JVMs are short-lived and share two cores with the broker under test.
JVM_OPTIONS = ("-Xmx512m", "-XX:+UseSerialGC")
DEADLINE_SHARE = 0.75
ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}
COMMIT_MODES = ("sync", "async", "none", "auto")


class JavaClientError(RuntimeError):
    """A harness run failed: non-zero exit, timeout, or output that breaks the line protocol."""

    def __init__(self, message: str, *, stdout: str = "", stderr: str = "") -> None:
        self.stdout = stdout
        self.stderr = stderr
        tail = "\n".join(stderr.strip().splitlines()[-40:])
        super().__init__(f"{message}\n--- java stderr (tail) ---\n{tail}" if tail else message)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One producer delivery report. partition/offset are None when the broker did not store the record."""

    index: int
    key: str | None
    value: str
    partition: int | None
    offset: int | None
    timestamp: int | None
    error: str | None  # exception class, e.g. "OutOfOrderSequenceException"; "NotSent" past the deadline
    error_message: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class Consumed:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None
    headers: tuple[tuple[str, str | None], ...]
    timestamp: int
    timestamp_type: str  # "CreateTime" or "LogAppendTime"


@dataclass(frozen=True, slots=True)
class AssignmentChange:
    kind: str  # "assigned", "revoked" or "lost"
    partitions: tuple[int, ...]
    generation: int
    member_id: str
    at_ms: int  # since the Java program started
    topic_partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Commit:
    offsets: Mapping[int, int]  # partition -> next offset to read
    error: str | None
    error_message: str | None
    at_ms: int
    generation: int = -1  # the member's generation when the commit was answered
    topic_offsets: Mapping[tuple[str, int], int] | None = None  # (topic, partition) -> next offset to read
    wall_ms: int = 0  # time.time() * 1000 when the commit was answered


@dataclass(frozen=True, slots=True)
class GroupConsumeResult:
    records: tuple[Consumed, ...]
    assignment_changes: tuple[AssignmentChange, ...]
    commits: tuple[Commit, ...]
    final_assignment: tuple[int, ...]
    stop_reason: str  # "max_records", "idle", "deadline" or "stopped"
    final_topic_assignment: tuple[tuple[str, int], ...] = ()

    @property
    def committed(self) -> dict[int, int]:
        """The last successfully committed offset per partition."""
        latest: dict[int, int] = {}
        for commit in self.commits:
            if commit.error is None:
                latest.update(commit.offsets)
        return latest


@functools.cache
def _unavailable_reason() -> str | None:
    if shutil.which("java") is None:
        return "java not found on PATH"
    try:
        java_harness.build()
    except java_harness.HarnessBuildError as error:
        return f"Java harness build failed: {error}"
    return None


def java_available() -> bool:
    """True when a JVM is installed and the harness is built (building it now if needed, once per process)."""
    return _unavailable_reason() is None


def java_unavailable_reason() -> str:
    """Why java_available() is False, for pytest skip messages; empty when it is True."""
    return _unavailable_reason() or ""


def run_java(
    main_class: str, args: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs one harness main class with the classpath set up; raises subprocess.TimeoutExpired past `timeout`."""
    reason = _unavailable_reason()
    if reason is not None:
        raise JavaClientError(reason)
    command = ["java", *JVM_OPTIONS, "-cp", java_harness.classpath(), main_class, *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False
    )


def java_client_version(*, timeout: float = 60) -> str:
    """The kafka-clients version on the harness classpath (AppInfoParser), e.g. "3.9.1"."""
    (line,) = _run_lines("KopVersion", [], timeout=timeout)
    return str(line["kafka_clients"])


def java_produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    idempotence: bool = True,
    acks: str = "all",
    max_in_flight: int = 5,
    compression: str = "none",
    linger_ms: int = 5,
    batch_size: int | None = None,
    key_prefix: str | None = None,
    value_prefix: str = "",
    start_index: int = 0,
    partition: int | None = None,
    headers: Mapping[str, str] | None = None,
    extra_props: Mapping[str, Any] | None = None,
    timeout: float = 120,
) -> list[Delivery]:
    """Sends `count` records with KafkaProducer and returns every delivery report, in callback order.

    Record i (from start_index) has value f"{value_prefix}{i}", key f"{key_prefix}{i}" (None without a prefix),
    and one header per `headers` entry, with "{i}" in its value replaced by i. Failed deliveries come back as
    Deliveries with `error` set; only a broken run (bad config, crash, timeout) raises JavaClientError.
    """
    deadline_ms = _deadline_ms(timeout)
    request_timeout_ms = min(30_000, deadline_ms // 2)
    props: dict[str, Any] = {
        "enable.idempotence": idempotence,
        "acks": acks,
        "max.in.flight.requests.per.connection": max_in_flight,
        "compression.type": compression,
        "linger.ms": linger_ms,
        "max.block.ms": min(60_000, deadline_ms),
        "request.timeout.ms": request_timeout_ms,
        # Kafka requires delivery.timeout.ms >= linger.ms + request.timeout.ms.
        "delivery.timeout.ms": max(deadline_ms, linger_ms + request_timeout_ms),
    }
    if batch_size is not None:
        props["batch.size"] = batch_size
    props.update(extra_props or {})
    args = ["--topic", topic, "--count", str(count), "--start-index", str(start_index),
            "--value-prefix", value_prefix, "--deadline-ms", str(deadline_ms)]
    if key_prefix is not None:
        args += ["--key-prefix", key_prefix]
    if partition is not None:
        args += ["--partition", str(partition)]
    for name, template in (headers or {}).items():
        args += ["--header", f"{name}={template}"]
    lines = _run_lines("KopProduce", _client_args(bootstrap, props) + args, timeout=timeout)
    summary = _summary(lines)
    deliveries = [_delivery(line) for line in lines if line["type"] == "delivery"]
    if len(deliveries) != count or summary["acked"] + summary["failed"] != count:
        raise JavaClientError(f"expected {count} delivery reports, got {len(deliveries)} (summary {summary})")
    return deliveries


def java_spark_sink_retry(bootstrap: str, topic: str, *, tasks: int, rows: int, sequence_headers: bool,
                          timeout: float = 120) -> dict[str, Any]:
    """Rows written as Spark's Kafka sink writes them, each task failing once after 60 % of its rows and retried
    with the same cached producer (KopSparkSinkRetry.java); returns its summary (sent, acked, failed, attempts)."""
    args = ["--topic", topic, "--tasks", str(tasks), "--rows", str(rows),
            "--sequence-headers", "true" if sequence_headers else "false"]
    return _summary(_run_lines("KopSparkSinkRetry", _client_args(bootstrap, {}) + args, timeout=timeout))


def java_transactions(bootstrap: str, mode: str, *, timeout: float = 120, **options: Any) -> dict[str, Any]:
    """The Java client's transactional producer (KopTransactions.java): mode "commit-abort" (topic, transactional_id,
    count), "timeout" (topic, transactional_id, count, transaction_timeout_ms), "spread" (transactional_id, topics as
    "name:partitions,...": an aborted and a committed transaction over all of them) or "copy", the
    consume-transform-produce loop (input, output, group, count, batch); returns its summary."""
    args = ["--mode", mode]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return _summary(_run_lines("KopTransactions", _client_args(bootstrap, {}) + args, timeout=timeout))


def java_admin(bootstrap: str, topic: str, *, timeout: float = 90) -> dict[str, Any]:
    """The Java AdminClient's view of a broker (KopAdmin.java): `topic` described (DescribeTopicPartitions), the
    topic lists with and without internal topics, the metadata quorum and the topic's configs with synonyms."""
    return _summary(_run_lines("KopAdmin", _client_args(bootstrap, {}) + ["--topic", topic], timeout=timeout))


def java_broker_configs(bootstrap: str, broker: str, *, set_configs: Mapping[str, str] | None = None,
                        delete: Sequence[str] = (), validate_only: bool = False, timeout: float = 90) -> dict[str, Any]:
    """kafka-configs.sh's broker operations through the Java AdminClient (KopBrokerConfigs.java):
    IncrementalAlterConfigs of broker resource `broker` (a node id, or "" for the cluster-wide default), then its
    configs described with synonyms; returns the summary: "error" ("none", or the alter's exception class and message) and "configs"."""
    args = ["--broker", broker, "--validate-only", "true" if validate_only else "false"]
    for key, value in (set_configs or {}).items():
        args += ["--set", f"{key}={value}"]
    for key in delete:
        args += ["--delete", key]
    return _summary(_run_lines("KopBrokerConfigs", _client_args(bootstrap, {}) + args, timeout=timeout))


def java_consume_all(
    bootstrap: str, topic: str, *, timeout: float = 60, extra_props: Mapping[str, Any] | None = None
) -> list[Consumed]:
    """Reads every partition of `topic` from the beginning to the end offsets seen at the start, without a group.

    Records come in fetch order (offset order within a partition). Raises JavaClientError if some partition did
    not reach its end offset in time.
    """
    return java_read_to_end(bootstrap, topic, timeout=timeout, extra_props=extra_props)[0]


def java_read_to_end(
    bootstrap: str, topic: str, *, timeout: float = 60, extra_props: Mapping[str, Any] | None = None
) -> tuple[list[Consumed], dict[int, int]]:
    """java_consume_all's records, and the end offset per partition the consumer read to (KafkaConsumer.endOffsets:
    the last stable offset for isolation.level=read_committed)."""
    args = ["--topic", topic, "--deadline-ms", str(_deadline_ms(timeout))]
    lines = _run_lines("KopConsume", _client_args(bootstrap, extra_props or {}) + args, timeout=timeout)
    summary = _summary(lines)
    if not summary["complete"]:
        raise JavaClientError(
            f"consumer stopped before the end of {topic}: positions {summary['positions']}, "
            f"end offsets {summary['end_offsets']}"
        )
    ends = {int(partition): offset for partition, offset in summary["end_offsets"].items()}
    return [_consumed(line) for line in lines if line["type"] == "record"], ends


def java_group_consume(
    bootstrap: str,
    topic: str | Sequence[str],
    group: str,
    *,
    max_records: int,
    commit: str = "sync",
    assignor: str | None = None,
    instance_id: str | None = None,
    idle_ms: int = 5_000,
    auto_offset_reset: str = "earliest",
    extra_props: Mapping[str, Any] | None = None,
    stop_file: str | None = None,
    timeout: float = 60,
) -> GroupConsumeResult:
    """Consumes `topic` (or several) as a member of `group` until max_records, idle_ms without progress, the
    deadline, or until `stop_file` exists.

    commit: "sync"/"async" commit what was read after each poll (never past max_records), "none" commits nothing,
    "auto" leaves it to the client's auto-commit. assignor: "range", "roundrobin", "sticky",
    "cooperative-sticky" or a class name. instance_id sets group.instance.id (static membership).
    Run several at once from threads to test rebalances.
    """
    if commit not in COMMIT_MODES:
        raise ValueError(f"commit must be one of {COMMIT_MODES}, got {commit!r}")
    props: dict[str, Any] = {"auto.offset.reset": auto_offset_reset, "enable.auto.commit": commit == "auto"}
    if assignor is not None:
        props["partition.assignment.strategy"] = ASSIGNORS.get(assignor, assignor)
    if instance_id is not None:
        props["group.instance.id"] = instance_id
    props.update(extra_props or {})
    args = [
        "--topic", topic if isinstance(topic, str) else ",".join(topic), "--group", group,
        "--max-records", str(max_records), "--idle-ms", str(idle_ms),
        "--commit", "none" if commit == "auto" else commit, "--deadline-ms", str(_deadline_ms(timeout)),
    ] + (["--stop-file", stop_file] if stop_file is not None else [])
    lines = _run_lines("KopGroupConsume", _client_args(bootstrap, props) + args, timeout=timeout)
    summary = _summary(lines)
    return GroupConsumeResult(
        records=tuple(_consumed(line) for line in lines if line["type"] == "record"),
        assignment_changes=tuple(
            AssignmentChange(
                kind=line["type"],
                partitions=tuple(line["partitions"]),
                generation=line["generation"],
                member_id=line["member_id"],
                at_ms=line["at_ms"],
                topic_partitions=tuple((t, p) for t, p in line["topic_partitions"]),
            )
            for line in lines
            if line["type"] in ("assigned", "revoked", "lost")
        ),
        commits=tuple(
            Commit(
                offsets={int(partition): offset for partition, offset in line["offsets"].items()},
                error=line["error"],
                error_message=line["error_message"],
                at_ms=line["at_ms"],
                generation=line["generation"],
                topic_offsets={(t, int(p)): o for t, by_p in line["topic_offsets"].items() for p, o in by_p.items()},
                wall_ms=line["wall_ms"],
            )
            for line in lines
            if line["type"] in ("committed", "commit_failed")
        ),
        final_assignment=tuple(summary["assignment"]),
        final_topic_assignment=tuple((t, p) for t, p in summary["topic_assignment"]),
        stop_reason=summary["reason"],
    )


def _deadline_ms(timeout: float) -> int:
    # The rest of `timeout` is left for JVM start-up and closing the client.
    return int(timeout * 1000 * DEADLINE_SHARE)


def _client_args(bootstrap: str, props: Mapping[str, Any]) -> list[str]:
    args = ["--bootstrap", bootstrap]
    for name, value in props.items():
        args += ["--prop", f"{name}={_prop_text(value)}"]
    return args


def _prop_text(value: Any) -> str:
    if isinstance(value, bool):  # Java wants "true"/"false", not Python's "True"
        return "true" if value else "false"
    return str(value)


def _run_lines(main_class: str, args: list[str], *, timeout: float) -> list[dict[str, Any]]:
    try:
        result = run_java(main_class, args, timeout)
    except subprocess.TimeoutExpired as expired:
        raise JavaClientError(
            f"{main_class} did not finish within {timeout}s",
            stdout=_text(expired.stdout),
            stderr=_text(expired.stderr),
        ) from expired
    if result.returncode != 0:
        raise JavaClientError(
            f"{main_class} exited with status {result.returncode}", stdout=result.stdout, stderr=result.stderr
        )
    try:
        return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise JavaClientError(
            f"{main_class} printed a line that is not JSON: {error}", stdout=result.stdout, stderr=result.stderr
        ) from error


def _summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    if not lines or lines[-1]["type"] != "summary":
        raise JavaClientError(f"harness output has no closing summary line: {lines[-3:]}")
    return lines[-1]


def _delivery(line: dict[str, Any]) -> Delivery:
    return Delivery(
        index=line["index"],
        key=line["key"],
        value=line["value"],
        partition=line["partition"],
        offset=line["offset"],
        timestamp=line["timestamp"],
        error=line["error"],
        error_message=line["error_message"],
    )


def _consumed(line: dict[str, Any]) -> Consumed:
    return Consumed(
        topic=line["topic"],
        partition=line["partition"],
        offset=line["offset"],
        key=line["key"],
        value=line["value"],
        headers=tuple((name, value) for name, value in line["headers"]),
        timestamp=line["timestamp"],
        timestamp_type=line["timestamp_type"],
    )


def _text(output: str | bytes | None) -> str:
    if output is None:
        return ""
    return output.decode("utf-8", "replace") if isinstance(output, bytes) else output
