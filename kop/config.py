"""Broker configuration: defaults, a `key=value` properties file, and command-line overrides.

Keys mirror Kafka's server.properties where the concept is Kafka's (num.partitions, message.max.bytes) and Pulsar's
broker.conf where it is Pulsar's (brokerDeduplicationEnabled, ...).
"""
from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str = ""
    advertised_port: int = 0  # 0: the port we listen on (a proxy in front of the broker sets its own)
    node_id: int = 1
    cluster_id: str = "kop-standalone"
    cluster_name: str = "standalone"
    data_dir: str = "./data"
    namespace: str = "public/default"
    admin_port: int = 0  # 0: no admin HTTP server; -1: any free port
    admin_failpoints_enabled: bool = False  # test-only fault injection routes on the admin API
    # topics
    auto_create_topics: bool = True
    num_partitions: int = 1
    max_partitions_per_topic: int = 10000
    # limits
    socket_request_max_bytes: int = 100 * 1024 * 1024
    message_max_bytes: int = 1048588
    max_in_flight_requests_per_connection: int = 5
    # Backpressure by bytes: a connection is not read while its requests not yet answered hold this many bytes
    # (one request may overshoot it, so any frame socket.request.max.bytes admits gets through).
    max_in_flight_bytes_per_connection: int = 10 * 1024 * 1024
    # The same bound over all connections (Kafka's key). Unbounded by default, as in Kafka: while it is reached no
    # connection is read, so one client holding a half-sent large frame would stall all others until the read timeout.
    queued_max_request_bytes: int = -1
    connections_max_idle_ms: int = 600_000  # between requests (Kafka's key and default)
    # How long a request body may take to arrive once its size is read; Kafka clients give up on a request after
    # request.timeout.ms (30 s by default), so a body slower than that only holds a buffer.
    socket_request_read_timeout_ms: int = 30_000
    max_connections: int = 10000
    # storage
    fsync: bool = True
    ledger_max_bytes: int = 256 * 1024 * 1024
    ledger_max_age_ms: int = 7 * 24 * 3600 * 1000  # Kafka's log.roll.ms (log.roll.hours=168)
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_check_interval_ms: int = 5 * 60 * 1000
    # PIP-6 deduplication
    broker_deduplication_enabled: bool = True
    broker_deduplication_entries_interval: int = 1000
    broker_deduplication_snapshot_interval_seconds: int = 120
    broker_deduplication_snapshot_frequency_seconds: int = 120
    broker_deduplication_max_number_of_producers: int = 10000
    broker_deduplication_producer_inactivity_timeout_minutes: int = 360
    # Test knob, not Pulsar's: when > 0, the inactivity timeout in seconds (Pulsar's minutes are at least 1).
    test_dedup_inactivity_timeout_seconds: int = 0
    # groups
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    def with_overrides(self, **kwargs: Any) -> "BrokerConfig":
        return replace(self, **{k: v for k, v in kwargs.items() if v is not None})


# Properties-file keys (Kafka / Pulsar spelling) -> BrokerConfig field.
ALIASES = {
    "num.partitions": "num_partitions",
    "auto.create.topics.enable": "auto_create_topics",
    "message.max.bytes": "message_max_bytes",
    "socket.request.max.bytes": "socket_request_max_bytes",
    "node.id": "node_id",
    "broker.id": "node_id",
    "log.retention.ms": "retention_ms",
    "log.retention.bytes": "retention_bytes",
    "log.segment.bytes": "ledger_max_bytes",
    "log.roll.ms": "ledger_max_age_ms",
    "advertised.host": "advertised_host",
    "advertised.port": "advertised_port",
    "webServicePort": "admin_port",
    "adminFailpointsEnabled": "admin_failpoints_enabled",
    "brokerDeduplicationEnabled": "broker_deduplication_enabled",
    "brokerDeduplicationEntriesInterval": "broker_deduplication_entries_interval",
    "brokerDeduplicationSnapshotIntervalSeconds": "broker_deduplication_snapshot_interval_seconds",
    "brokerDeduplicationSnapshotFrequencyInSeconds": "broker_deduplication_snapshot_frequency_seconds",
    "brokerDeduplicationMaxNumberOfProducers": "broker_deduplication_max_number_of_producers",
    "brokerDeduplicationProducerInactivityTimeoutMinutes": "broker_deduplication_producer_inactivity_timeout_minutes",
    "testDedupProducerInactivityTimeoutSeconds": "test_dedup_inactivity_timeout_seconds",
}


# Keys without a BrokerConfig field that modules read from `extra` (kop/groups). A key in neither place is reported
# as unknown at startup.
EXTRA_KEYS = frozenset({"offset.metadata.max.bytes", "group.max.size", "offsets.retention.check.interval.ms"})


def unknown_keys(config: BrokerConfig) -> list[str]:
    return sorted(key for key in config.extra if key not in EXTRA_KEYS)


def _convert(kind: Any, raw: str) -> Any:
    if kind in (bool, "bool"):
        if raw.strip().lower() in ("true", "1", "yes", "on"):
            return True
        if raw.strip().lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {raw!r}")
    if kind in (int, "int"):
        return int(raw.strip())
    return raw.strip()


def load_properties(path: str, base: BrokerConfig | None = None) -> BrokerConfig:
    """Read a `key=value` file (# comments); unknown keys are kept in `extra` and reported by the caller."""
    base = base or BrokerConfig()
    types = {f.name: f.type for f in fields(BrokerConfig)}
    values: dict[str, Any] = {}
    extra = dict(base.extra)
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}:{lineno}: expected key=value")
            key, raw = (part.strip() for part in line.split("=", 1))
            name = ALIASES.get(key, key.replace(".", "_"))
            if name in types and name != "extra":
                try:
                    values[name] = _convert(types[name], raw)
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: {key}: {exc}") from None
            else:
                extra[key] = raw
    return replace(base, extra=extra, **values)
