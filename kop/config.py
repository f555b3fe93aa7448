"""Broker configuration: every setting with its default and the values it accepts, in one table.

Each field's metadata holds its check (kop/config_checks.py) and the properties-file keys that set it besides its own
name with dots (`message_max_bytes` is `message.max.bytes`): Kafka's server.properties spelling where the concept is
Kafka's, Pulsar's broker.conf spelling where it is Pulsar's. A BrokerConfig is checked when it is made, so one that
exists holds only values the broker can run with; the properties file itself is read by kop/config_file.py.
"""
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from kop.config_checks import INT32_MAX, INT64_MAX, WILDCARD_HOSTS, HostName, Matches, Range

Check = Callable[[Any], None]
PORT = Range(0, 65535)
SIZE = Range(1)  # bytes or a count: at least one
MILLIS = Range(1, INT64_MAX)
NAME = Matches(r"[\w.-]+", "letters, digits, '.', '_' or '-'")


def setting(default: Any, check: Check | None = None, *keys: str) -> Any:
    """A field with its check (None: any value of its type) and the file keys that set it besides its own name."""
    return field(default=default, metadata={"check": check, "keys": keys})


@dataclass(frozen=True)
class BrokerConfig:
    host: str = setting("127.0.0.1", HostName())  # and Kafka's `listeners` (kop/config_file.py)
    port: int = setting(9092, PORT)  # 0: any free port
    advertised_host: str = setting("", HostName(empty_ok=True, wildcard_ok=False))  # "": the host we listen on
    advertised_port: int = setting(0, PORT)  # 0: the port we listen on (a proxy in front of the broker sets its own)
    node_id: int = setting(1, Range(0), "node.id", "broker.id")
    cluster_id: str = setting("kop-standalone", NAME)
    cluster_name: str = setting("standalone", NAME, "clusterName")
    data_dir: str = setting("./data", Matches(r".+", "a directory"))  # and Kafka's `log.dirs`
    namespace: str = setting("public/default", Matches(r"[-=:.\w]+/[-=:.\w]+", "tenant/namespace"))
    admin_port: int = setting(0, Range(-1, 65535), "webServicePort")  # 0: no admin HTTP server; -1: any free port
    # test-only fault injection routes on the admin API
    admin_failpoints_enabled: bool = setting(False, None, "adminFailpointsEnabled")
    # topics
    auto_create_topics: bool = setting(True, None, "auto.create.topics.enable")
    num_partitions: int = setting(1, SIZE)
    max_partitions_per_topic: int = setting(10000, SIZE)
    # limits
    socket_request_max_bytes: int = setting(100 * 1024 * 1024, SIZE)
    message_max_bytes: int = setting(1048588, SIZE)
    max_in_flight_requests_per_connection: int = setting(5, SIZE)
    # Backpressure by bytes: a connection is not read while its requests not yet answered hold this many bytes
    # (one request may overshoot it, so any frame socket.request.max.bytes admits gets through).
    max_in_flight_bytes_per_connection: int = setting(10 * 1024 * 1024, Range(1, INT64_MAX))
    # The same bound over all connections (Kafka's key). Unbounded by default, as in Kafka: while it is reached no
    # connection is read, so one client holding a half-sent large frame would stall all others until the read timeout.
    queued_max_request_bytes: int = setting(-1, Range(1, INT64_MAX, unbounded=-1))
    connections_max_idle_ms: int = setting(600_000, MILLIS)  # between requests (Kafka's key and default)
    # How long a request body may take to arrive once its size is read; Kafka clients give up on a request after
    # request.timeout.ms (30 s by default), so a body slower than that only holds a buffer.
    socket_request_read_timeout_ms: int = setting(30_000, MILLIS)
    max_connections: int = setting(10000, SIZE)
    # storage
    fsync: bool = setting(True)
    ledger_max_bytes: int = setting(256 * 1024 * 1024, Range(14), "log.segment.bytes")  # Kafka's lower bound
    # Kafka's log.roll.ms (log.roll.hours=168)
    ledger_max_age_ms: int = setting(7 * 24 * 3600 * 1000, MILLIS, "log.roll.ms")
    retention_ms: int = setting(7 * 24 * 3600 * 1000, Range(0, INT64_MAX, unbounded=-1), "log.retention.ms")
    retention_bytes: int = setting(-1, Range(0, INT64_MAX, unbounded=-1), "log.retention.bytes")
    retention_check_interval_ms: int = setting(5 * 60 * 1000, MILLIS, "log.retention.check.interval.ms")
    # PIP-6 deduplication
    broker_deduplication_enabled: bool = setting(True, None, "brokerDeduplicationEnabled")
    broker_deduplication_entries_interval: int = setting(1000, SIZE, "brokerDeduplicationEntriesInterval")
    broker_deduplication_snapshot_interval_seconds: int = setting(  # 0: no time-based snapshots
        120, Range(0), "brokerDeduplicationSnapshotIntervalSeconds")
    broker_deduplication_snapshot_frequency_seconds: int = setting(  # 0: no time-based snapshot task
        120, Range(0), "brokerDeduplicationSnapshotFrequencyInSeconds")
    # Pulsar's default is 10,000; Kafka gives every producer start a new id and application-chosen names are per
    # file or task, so a busy partition passes that within the inactivity timeout (BENCHMARKS.md: 100,000 names).
    broker_deduplication_max_number_of_producers: int = setting(100_000, SIZE,
                                                                "brokerDeduplicationMaxNumberOfProducers")
    broker_deduplication_producer_inactivity_timeout_minutes: int = setting(
        360, SIZE, "brokerDeduplicationProducerInactivityTimeoutMinutes")
    # Test knob, not Pulsar's: when > 0, the inactivity timeout in seconds (Pulsar's minutes are at least 1).
    test_dedup_inactivity_timeout_seconds: int = setting(0, Range(0), "testDedupProducerInactivityTimeoutSeconds")
    # groups
    group_min_session_timeout_ms: int = setting(6000, SIZE)
    group_max_session_timeout_ms: int = setting(1800000, SIZE)
    group_initial_rebalance_delay_ms: int = setting(0, Range(0))
    group_max_size: int = setting(INT32_MAX, SIZE)
    offset_metadata_max_bytes: int = setting(4096, Range(0))
    offsets_retention_check_interval_ms: int = setting(600_000, MILLIS)
    # transactions (Kafka's keys and defaults)
    transaction_max_timeout_ms: int = setting(900_000, Range(1, INT32_MAX))
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = setting(10_000, Range(1, INT32_MAX))
    transactional_id_expiration_ms: int = setting(7 * 24 * 3600 * 1000, Range(1, INT32_MAX))

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                check_setting(f.name, getattr(self, f.name))
            except ValueError as exc:
                raise ValueError(f"{setting_key(f.name)}: {exc}") from None
        for holds, message in RULES:
            if not holds(self):
                raise ValueError(message(self))

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host


# Rules between settings: (holds, what to say when it does not).
RULES: tuple[tuple[Callable[[BrokerConfig], bool], Callable[[BrokerConfig], str]], ...] = (
    (lambda c: c.num_partitions <= c.max_partitions_per_topic,
     lambda c: f"num.partitions ({c.num_partitions}) exceeds max.partitions.per.topic ({c.max_partitions_per_topic})"),
    (lambda c: c.group_min_session_timeout_ms <= c.group_max_session_timeout_ms,
     lambda c: f"group.min.session.timeout.ms ({c.group_min_session_timeout_ms}) exceeds "
               f"group.max.session.timeout.ms ({c.group_max_session_timeout_ms})"),
    (lambda c: c.host not in WILDCARD_HOSTS or c.advertised_host != "",
     lambda c: f"listening on every interface ({c.host}) needs an advertised host clients can connect to: set "
               f"--advertised-host or advertised.listeners"),
)

FIELDS = {f.name: f for f in fields(BrokerConfig)}


def setting_key(name: str) -> str:
    """The key users know the field by: its first file key (Kafka's or Pulsar's name), else its name with dots."""
    keys = FIELDS[name].metadata["keys"]
    return keys[0] if keys else name.replace("_", ".")


def check_setting(name: str, value: Any) -> None:
    """Raise ValueError saying what field `name` accepts when `value` is not one of those values."""
    f = FIELDS[name]
    if not isinstance(value, f.type) or (f.type is int and isinstance(value, bool)):
        raise ValueError(f"expected {f.type.__name__}, got {value!r}")
    if f.metadata["check"] is not None:
        f.metadata["check"](value)


# Kafka accepts true and false in any case; yes/no/on/off/1/0 are kept from kop's first parser.
BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _boolean(raw: str) -> bool:
    value = BOOLEANS.get(raw.lower())
    if value is None:
        raise ValueError(f"not a boolean (true or false): {raw!r}")
    return value


def parse_integer(raw: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", raw):
        raise ValueError(f"not an integer: {raw!r}")
    return int(raw)


CONVERTERS: dict[type, Callable[[str], Any]] = {bool: _boolean, int: parse_integer, str: str}


def parse_setting(name: str, raw: str) -> Any:
    """The value of field `name` written as `raw` (a file value or a command-line argument), checked."""
    value = CONVERTERS[FIELDS[name].type](raw.strip())
    check_setting(name, value)
    return value
