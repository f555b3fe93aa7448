"""The Java client harness builds, runs kafka-clients 3.9, and reports failures faithfully; no broker needed."""

from __future__ import annotations

import socket

import pytest

from integration import java_harness
from integration.java_client import (
    JavaClientError,
    java_available,
    java_client_version,
    java_consume_all,
    java_produce,
    java_unavailable_reason,
)

pytestmark = pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())


def closed_local_port() -> str:
    """An address on this machine where nothing listens: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


def test_second_build_finds_everything_up_to_date() -> None:
    java_harness.build()

    again = java_harness.build()

    assert again.did_nothing, again.summary()
    assert again.summary().startswith("java harness: up to date")


def test_harness_runs_kafka_clients_3_9() -> None:
    assert java_client_version().startswith("3.9.")


def test_produce_without_broker_reports_every_record_as_failed_with_its_value() -> None:
    # Quote, backslash, newline and non-ASCII exercise the hand-written JSON on the Java side.
    prefix = 'q"b\\n\nü€-'

    deliveries = java_produce(
        closed_local_port(), "nowhere", 2, value_prefix=prefix, key_prefix="k", extra_props={"max.block.ms": 1000},
        timeout=30,
    )

    assert [d.index for d in deliveries] == [0, 1]
    assert [d.value for d in deliveries] == [f"{prefix}0", f"{prefix}1"]
    assert [d.key for d in deliveries] == ["k0", "k1"]
    assert all(not d.ok and d.error == "TimeoutException" for d in deliveries)
    assert all(d.offset is None for d in deliveries)


def test_idempotent_producer_with_acks_1_is_refused_by_the_client() -> None:
    with pytest.raises(JavaClientError) as refused:
        java_produce(closed_local_port(), "nowhere", 1, idempotence=True, acks="1", timeout=30)

    assert "ConfigException" in refused.value.stderr


def test_consume_all_without_broker_fails_with_a_reason() -> None:
    with pytest.raises(JavaClientError) as failed:
        java_consume_all(closed_local_port(), "nowhere", timeout=10)  # the JVM starts slowly on a loaded machine

    assert "has no partitions in metadata" in str(failed.value)
