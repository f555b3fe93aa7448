"""DescribeConfigs (key 32), AlterConfigs (key 33) and IncrementalAlterConfigs (key 44). Version notes:
DescribeConfigs v1+ config sources and synonyms, v3+ types and documentation. Resource types: 2 = topic,
4 = broker. Values are the ones in force: topic overrides first, then the broker's defaults. Topic configs can be
altered; broker configs are static (set in the properties file)."""
from collections.abc import Callable, Sequence
from typing import Any

from kafka.protocol.admin import (AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest,
                                  DescribeConfigsResponse, IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse)

from kop.config import BrokerConfig
from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.topics import TOPIC_CONFIG_DEFAULTS, Topic, TopicError
from protocol.errors import ErrorCode

TOPIC, BROKER = 2, 4
# Kafka's ConfigSource codes
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's ConfigType codes
BOOLEAN, STRING, INT, LONG, LIST = 1, 2, 3, 5, 7


def _broker_configs(ctx: RequestContext) -> dict[str, tuple[str, int, int]]:
    """(value, type, source): STATIC_BROKER_CONFIG where the properties file or command line set the value,
    DEFAULT_CONFIG where it is the broker's default, as Kafka reports them."""
    config, defaults = ctx.config, BrokerConfig()
    listener = f"{ctx.endpoint.listener}://{ctx.endpoint.host}:{ctx.endpoint.port}"
    entries = [  # (Kafka's name, value, type, BrokerConfig fields it comes from)
        ("broker.id", str(config.node_id), INT, ("node_id",)),
        ("advertised.listeners", listener, STRING, ("advertised_host", "advertised_port")),
        ("num.partitions", str(config.num_partitions), INT, ("num_partitions",)),
        ("auto.create.topics.enable", str(config.auto_create_topics).lower(), BOOLEAN, ("auto_create_topics",)),
        ("message.max.bytes", str(config.message_max_bytes), INT, ("message_max_bytes",)),
        ("socket.request.max.bytes", str(config.socket_request_max_bytes), INT, ("socket_request_max_bytes",)),
        ("queued.max.request.bytes", str(config.queued_max_request_bytes), LONG, ("queued_max_request_bytes",)),
        ("max.in.flight.bytes.per.connection", str(config.max_in_flight_bytes_per_connection), LONG,
         ("max_in_flight_bytes_per_connection",)),
        ("connections.max.idle.ms", str(config.connections_max_idle_ms), LONG, ("connections_max_idle_ms",)),
        ("connections.max.reauth.ms", str(config.connections_max_reauth_ms), LONG, ("connections_max_reauth_ms",)),
        ("sasl.enabled.mechanisms", config.sasl_enabled_mechanisms, LIST, ("sasl_enabled_mechanisms",)),
        ("socket.request.read.timeout.ms", str(config.socket_request_read_timeout_ms), LONG,
         ("socket_request_read_timeout_ms",)),
        ("log.retention.ms", str(config.retention_ms), LONG, ("retention_ms",)),
        ("log.retention.bytes", str(config.retention_bytes), LONG, ("retention_bytes",)),
        ("log.segment.bytes", str(config.ledger_max_bytes), INT, ("ledger_max_bytes",)),
        ("log.roll.ms", str(config.ledger_max_age_ms), LONG, ("ledger_max_age_ms",)),
        ("default.replication.factor", "1", INT, ()),
        ("min.insync.replicas", "1", INT, ()),
        ("group.initial.rebalance.delay.ms", str(config.group_initial_rebalance_delay_ms), INT,
         ("group_initial_rebalance_delay_ms",)),
        ("brokerDeduplicationEnabled", str(config.broker_deduplication_enabled).lower(), BOOLEAN,
         ("broker_deduplication_enabled",)),
        ("brokerDeduplicationEntriesInterval", str(config.broker_deduplication_entries_interval), INT,
         ("broker_deduplication_entries_interval",)),
        ("brokerDeduplicationSnapshotIntervalSeconds", str(config.broker_deduplication_snapshot_interval_seconds),
         INT, ("broker_deduplication_snapshot_interval_seconds",)),
    ]
    out = {}
    for name, value, kind, sources in entries:
        explicit = any(getattr(config, f) != getattr(defaults, f) for f in sources)
        out[name] = (value, kind, STATIC_BROKER_CONFIG if explicit else DEFAULT_CONFIG)
    return out


def _topic_configs(config: BrokerConfig, topic: Topic) -> dict[str, tuple[str, int, int]]:
    defaults = {
        "cleanup.policy": ("delete", STRING),
        "retention.ms": (str(config.retention_ms), LONG),
        "retention.bytes": (str(config.retention_bytes), LONG),
        "max.message.bytes": (str(config.message_max_bytes), INT),
        "segment.bytes": (str(config.ledger_max_bytes), INT),
        "segment.ms": (str(config.ledger_max_age_ms), LONG),
        "message.timestamp.type": ("CreateTime", STRING),
        "min.insync.replicas": ("1", INT),
        "compression.type": ("producer", STRING),
    }
    out = {}
    for name, (value, kind) in defaults.items():
        if name in topic.configs:
            out[name] = (topic.configs[name], kind, DYNAMIC_TOPIC_CONFIG)
        else:
            out[name] = (value, kind, DEFAULT_CONFIG)
    for name, value in topic.configs.items():  # overrides kop stores without acting on them
        out.setdefault(name, (value, STRING, DYNAMIC_TOPIC_CONFIG))
    return out


def _authorized(ctx: RequestContext, operation: Operation, resource_type: int, name: str) -> bool:
    """Topics are authorized by name, the broker as the cluster."""
    if resource_type == TOPIC:
        return ctx.authorized(operation, ResourceType.TOPIC, name)
    return ctx.authorized_on_cluster(operation)


def _refusal(resource_type: int) -> tuple[ErrorCode, str]:
    if resource_type == TOPIC:
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized for this topic's configs"
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "not authorized for the broker's configs"


async def describe_configs(ctx: RequestContext, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    cls = DescribeConfigsResponse[ctx.version]
    entry_cls = cls.DescribeConfigsResult.DescribeConfigsResourceResult
    results = []
    for res in request.resources:
        result = cls.DescribeConfigsResult(error_code=ErrorCode.NONE, error_message=None,
                                           resource_type=res.resource_type, resource_name=res.resource_name,
                                           configs=[])
        if not _authorized(ctx, Operation.DESCRIBE_CONFIGS, res.resource_type, res.resource_name):
            result.error_code, result.error_message = _refusal(res.resource_type)
            results.append(result)
            continue
        if res.resource_type == TOPIC:
            topic = ctx.topics.get(res.resource_name)
            if topic is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"unknown topic {res.resource_name!r}"
                values = {}
            else:
                values = _topic_configs(ctx.config, topic)
        elif res.resource_type == BROKER:
            if res.resource_name not in ("", str(ctx.config.node_id)):
                result.error_code = ErrorCode.INVALID_REQUEST
                result.error_message = f"unknown broker {res.resource_name!r}"
                values = {}
            else:
                values = _broker_configs(ctx)
        else:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"resource type {res.resource_type} is not supported"
            values = {}
        keys = res.configuration_keys
        for name, (value, kind, source) in values.items():
            if keys is not None and name not in keys:
                continue
            # Broker configs cannot be altered at run time (read-only); topic configs can.
            result.configs.append(entry_cls(name=name, value=value, read_only=res.resource_type == BROKER,
                                            config_source=source, is_default=source == DEFAULT_CONFIG,
                                            is_sensitive=False, synonyms=[], config_type=kind, documentation=None))
        results.append(result)
    return cls(throttle_time_ms=0, results=results)


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations
LIST_CONFIGS = frozenset({"cleanup.policy", "follower.replication.throttled.replicas",
                          "leader.replication.throttled.replicas"})


def _incremental(current: dict[str, str], changes: Sequence[Any]) -> dict[str, str]:
    configs = dict(current)
    for change in changes:
        if change.config_operation == SET:
            if change.value is None:
                raise TopicError(ErrorCode.INVALID_REQUEST, f"null value for {change.name}; DELETE removes a config")
            configs[change.name] = change.value
        elif change.config_operation == DELETE:
            configs.pop(change.name, None)
        elif change.config_operation in (APPEND, SUBTRACT):
            if change.name not in LIST_CONFIGS:
                raise TopicError(ErrorCode.INVALID_CONFIG, f"{change.name} is not a list; cannot append or subtract")
            current_value = configs.get(change.name, TOPIC_CONFIG_DEFAULTS.get(change.name) or "")  # as Kafka
            items = [v for v in current_value.split(",") if v]
            values = [v for v in (change.value or "").split(",") if v]
            if change.config_operation == APPEND:
                items += [v for v in values if v not in items]
            else:
                items = [v for v in items if v not in values]
            configs[change.name] = ",".join(items)
        else:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"unknown config operation {change.config_operation}")
    return configs


# (the topic's overrides, the request's config entries) -> the overrides to store
ConfigChange = Callable[[dict[str, str], Sequence[Any]], dict[str, str]]


async def _alter(ctx: RequestContext, request: AlterConfigsRequest | IncrementalAlterConfigsRequest,
                 response: type[AlterConfigsResponse] | type[IncrementalAlterConfigsResponse],
                 new_configs: ConfigChange) -> AlterConfigsResponse | IncrementalAlterConfigsResponse:
    cls = response[ctx.version]
    results = []
    for res in request.resources:
        result = cls.AlterConfigsResourceResponse(error_code=ErrorCode.NONE, error_message=None,
                                                  resource_type=res.resource_type, resource_name=res.resource_name)
        try:
            if not _authorized(ctx, Operation.ALTER_CONFIGS, res.resource_type, res.resource_name):
                raise TopicError(*_refusal(res.resource_type))
            if res.resource_type == BROKER:
                raise TopicError(ErrorCode.INVALID_REQUEST, "broker configs are static: set them in the properties "
                                                            "file and restart")
            if res.resource_type != TOPIC:
                raise TopicError(ErrorCode.INVALID_REQUEST, f"resource type {res.resource_type} is not supported")
            topic = ctx.topics.get(res.resource_name)
            if topic is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {res.resource_name!r}")
            await ctx.topics.set_configs(res.resource_name, new_configs(topic.configs, res.configs),
                                                request.validate_only)
        except TopicError as exc:
            result.error_code, result.error_message = exc.code, str(exc)
        results.append(result)
    return cls(throttle_time_ms=0, responses=results)


async def alter_configs(ctx: RequestContext, request: AlterConfigsRequest) -> AlterConfigsResponse:
    """AlterConfigs replaces every override of the resource: configs left out return to their defaults."""
    return await _alter(ctx, request, AlterConfigsResponse,
                        lambda _current, changes: {c.name: c.value for c in changes if c.value is not None})


async def incremental_alter_configs(ctx: RequestContext,
                                    request: IncrementalAlterConfigsRequest) -> IncrementalAlterConfigsResponse:
    return await _alter(ctx, request, IncrementalAlterConfigsResponse, _incremental)


ROUTES = [
    (DescribeConfigsRequest.API_KEY, 0, 4, describe_configs),
    (AlterConfigsRequest.API_KEY, 0, 2, alter_configs),
    (IncrementalAlterConfigsRequest.API_KEY, 0, 1, incremental_alter_configs),
]
