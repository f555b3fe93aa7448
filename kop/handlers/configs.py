"""DescribeConfigs (key 32), AlterConfigs (key 33), IncrementalAlterConfigs (key 44) and ListConfigResources
(key 74). Version notes: DescribeConfigs v1+ config sources and synonyms, v3+ types and documentation. Resource
types: 2 = topic, 4 = broker. Values are the ones in force: topic overrides first, then the broker's settings, each
with its true source (DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG for what the properties file or command line set,
DEFAULT_CONFIG). Topic configs can be altered; broker configs are static (set in the properties file)."""
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest,
                                  DescribeConfigsResponse, IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse, ListConfigResourcesRequest,
                                  ListConfigResourcesResponse)

from kop.handlers.context import RequestContext
from kop import internal_topics
from kop.compaction.settings import DEFAULTS as COMPACTION
from kop.security.acls import Operation, ResourceType
from kop.topics import TOPIC_CONFIG_DEFAULTS, TopicError, unknown_topic
from protocol.errors import ErrorCode

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
# Kafka's ConfigSource codes
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's ConfigType codes
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
LONG_MAX = str(2**63 - 1)


@dataclass(frozen=True)
class Described:
    """One config as DescribeConfigs reports it: its value in force, its type and source, and its synonyms (the
    settings it comes from, most specific first: the topic's override, then the broker's setting or default)."""

    value: str | None
    kind: int
    source: int
    synonyms: tuple[tuple[str, str | None, int], ...]  # (name, value, source)


@dataclass(frozen=True)
class BrokerSetting:
    name: str  # Kafka's name
    kind: int
    fields: tuple[str, ...]  # the BrokerConfig fields it comes from; none: a fixed value of a single broker
    render: Callable[[RequestContext], str]


def _field(name: str) -> Callable[[RequestContext], str]:
    def render(ctx: RequestContext) -> str:
        value = getattr(ctx.config, name)
        return str(value).lower() if isinstance(value, bool) else str(value)
    return render


def _fixed(value: str) -> Callable[[RequestContext], str]:
    return lambda _ctx: value


def _setting(name: str, kind: int, field: str) -> BrokerSetting:
    return BrokerSetting(name, kind, (field,), _field(field))


BROKER_SETTINGS = (
    _setting("broker.id", INT, "node_id"),
    BrokerSetting("advertised.listeners", STRING, ("host", "port", "advertised_host", "advertised_port", "listeners"),
                  lambda ctx: f"{ctx.endpoint.listener}://{ctx.endpoint.host}:{ctx.endpoint.port}"),
    _setting("num.partitions", INT, "num_partitions"),
    _setting("auto.create.topics.enable", BOOLEAN, "auto_create_topics"),
    _setting("message.max.bytes", INT, "message_max_bytes"),
    _setting("socket.request.max.bytes", INT, "socket_request_max_bytes"),
    _setting("queued.max.request.bytes", LONG, "queued_max_request_bytes"),
    _setting("max.in.flight.bytes.per.connection", LONG, "max_in_flight_bytes_per_connection"),
    _setting("connections.max.idle.ms", LONG, "connections_max_idle_ms"),
    _setting("connections.max.reauth.ms", LONG, "connections_max_reauth_ms"),
    _setting("sasl.enabled.mechanisms", LIST, "sasl_enabled_mechanisms"),
    _setting("socket.request.read.timeout.ms", LONG, "socket_request_read_timeout_ms"),
    _setting("log.retention.ms", LONG, "retention_ms"),
    _setting("log.retention.bytes", LONG, "retention_bytes"),
    _setting("log.segment.bytes", INT, "ledger_max_bytes"),
    _setting("log.roll.ms", LONG, "ledger_max_age_ms"),
    BrokerSetting("default.replication.factor", INT, (), _fixed("1")),
    BrokerSetting("min.insync.replicas", INT, (), _fixed("1")),
    BrokerSetting("offsets.topic.num.partitions", INT, (), _fixed(str(internal_topics.CONSUMER_OFFSETS_PARTITIONS))),
    BrokerSetting("log.cleanup.policy", LIST, (), _fixed("delete")),
    BrokerSetting("compression.type", STRING, (), _fixed("producer")),
    BrokerSetting("log.message.timestamp.type", STRING, (), _fixed("CreateTime")),
    _setting("group.initial.rebalance.delay.ms", INT, "group_initial_rebalance_delay_ms"),
    _setting("group.consumer.session.timeout.ms", INT, "group_consumer_session_timeout_ms"),
    _setting("group.consumer.heartbeat.interval.ms", INT, "group_consumer_heartbeat_interval_ms"),
    _setting("group.consumer.assignors", LIST, "group_consumer_assignors"),
    _setting("group.consumer.migration.policy", STRING, "group_consumer_migration_policy"),
    _setting("brokerDeduplicationEnabled", BOOLEAN, "broker_deduplication_enabled"),
    _setting("brokerDeduplicationEntriesInterval", INT, "broker_deduplication_entries_interval"),
    _setting("brokerDeduplicationSnapshotIntervalSeconds", INT, "broker_deduplication_snapshot_interval_seconds"),
)
BROKER_SETTINGS_BY_NAME = {s.name: s for s in BROKER_SETTINGS}

# Topic configs: (name, type, the broker setting that supplies its default, or the fixed default Kafka 4.x reports).
# Kafka 4.x's defaults are reported for the configs kop stores without acting on, and kop's compaction's (Kafka's).
TOPIC_SETTINGS: tuple[tuple[str, int, str], ...] = (
    ("cleanup.policy", LIST, "log.cleanup.policy"),
    ("compression.type", STRING, "compression.type"),
    ("max.message.bytes", INT, "message.max.bytes"),
    ("message.timestamp.type", STRING, "log.message.timestamp.type"),
    ("min.insync.replicas", INT, "min.insync.replicas"),
    ("retention.bytes", LONG, "log.retention.bytes"),
    ("retention.ms", LONG, "log.retention.ms"),
    ("segment.bytes", INT, "log.segment.bytes"),
    ("segment.ms", LONG, "log.roll.ms"),
)
TOPIC_FIXED_DEFAULTS: tuple[tuple[str, int, str, str], ...] = (  # (name, type, Kafka's broker key, Kafka's default)
    ("delete.retention.ms", LONG, "log.cleaner.delete.retention.ms", COMPACTION["delete.retention.ms"]),
    ("file.delete.delay.ms", LONG, "log.segment.delete.delay.ms", "60000"),
    ("flush.messages", LONG, "log.flush.interval.messages", LONG_MAX),
    ("flush.ms", LONG, "log.flush.interval.ms", LONG_MAX),
    ("follower.replication.throttled.replicas", LIST, "follower.replication.throttled.replicas", ""),
    ("index.interval.bytes", INT, "log.index.interval.bytes", "4096"),
    ("leader.replication.throttled.replicas", LIST, "leader.replication.throttled.replicas", ""),
    ("local.retention.bytes", LONG, "log.local.retention.bytes", "-2"),
    ("local.retention.ms", LONG, "log.local.retention.ms", "-2"),
    ("max.compaction.lag.ms", LONG, "log.cleaner.max.compaction.lag.ms", COMPACTION["max.compaction.lag.ms"]),
    ("message.timestamp.after.max.ms", LONG, "log.message.timestamp.after.max.ms", "3600000"),
    ("message.timestamp.before.max.ms", LONG, "log.message.timestamp.before.max.ms", LONG_MAX),
    ("min.cleanable.dirty.ratio", DOUBLE, "log.cleaner.min.cleanable.ratio", COMPACTION["min.cleanable.dirty.ratio"]),
    ("min.compaction.lag.ms", LONG, "log.cleaner.min.compaction.lag.ms", COMPACTION["min.compaction.lag.ms"]),
    ("preallocate", BOOLEAN, "log.preallocate", "false"),
    ("remote.storage.enable", BOOLEAN, "remote.log.storage.system.enable", "false"),
    ("segment.index.bytes", INT, "log.index.size.max.bytes", "10485760"),
    ("segment.jitter.ms", LONG, "log.roll.jitter.ms", "0"),
    ("unclean.leader.election.enable", BOOLEAN, "unclean.leader.election.enable", "false"),
)


def _broker_setting(ctx: RequestContext, setting: BrokerSetting) -> tuple[str, int]:
    """(value, source): STATIC_BROKER_CONFIG where the properties file or command line set it, else DEFAULT_CONFIG."""
    explicit = any(f in ctx.services.explicit_settings for f in setting.fields)
    return setting.render(ctx), STATIC_BROKER_CONFIG if explicit else DEFAULT_CONFIG


def _broker_configs(ctx: RequestContext) -> dict[str, Described]:
    out = {}
    for setting in BROKER_SETTINGS:
        value, source = _broker_setting(ctx, setting)
        out[setting.name] = Described(value, setting.kind, source, ((setting.name, value, source),))
    return out


def _topic_configs(ctx: RequestContext, overrides: dict[str, str]) -> dict[str, Described]:
    """A topic's override comes first (DYNAMIC_TOPIC_CONFIG); without one the value and source are the broker
    setting's, as Kafka reports them (a topic whose default the properties file set says STATIC_BROKER_CONFIG)."""
    defaults = []
    for name, kind, broker_name in TOPIC_SETTINGS:
        value, source = _broker_setting(ctx, BROKER_SETTINGS_BY_NAME[broker_name])
        defaults.append((name, kind, (broker_name, value, source)))
    defaults += [(name, kind, (broker_name, value, DEFAULT_CONFIG))
                 for name, kind, broker_name, value in TOPIC_FIXED_DEFAULTS]
    out = {}
    for name, kind, synonym in defaults:
        override = overrides.get(name)
        if override is None:
            out[name] = Described(synonym[1], kind, synonym[2], (synonym,))
        else:
            out[name] = Described(override, kind, DYNAMIC_TOPIC_CONFIG,
                                  ((name, override, DYNAMIC_TOPIC_CONFIG), synonym))
    for name, value in overrides.items():  # overrides of configs Kafka 4.x no longer has (stored as given)
        out.setdefault(name, Described(value, STRING, DYNAMIC_TOPIC_CONFIG, ((name, value, DYNAMIC_TOPIC_CONFIG),)))
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
def _resource_configs(ctx: RequestContext, resource_type: int, name: str) -> dict[str, Described]:
    if resource_type == TOPIC:
        if internal_topics.is_internal(name):  # described as Kafka creates it, so tools that list every topic work
            return _topic_configs(ctx, internal_topics.CONSUMER_OFFSETS_CONFIGS)
        topic = ctx.topics.get(name)
        if topic is None:
            raise unknown_topic(name)
        return _topic_configs(ctx, topic.configs)
    if resource_type == BROKER:
        if name not in ("", str(ctx.config.node_id)):
            raise TopicError(ErrorCode.INVALID_REQUEST, f"unknown broker {name!r}")
        return _broker_configs(ctx)
    raise TopicError(ErrorCode.INVALID_REQUEST, f"resource type {resource_type} is not supported")


async def describe_configs(ctx: RequestContext, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    cls = DescribeConfigsResponse[ctx.version]
    entry_cls = cls.DescribeConfigsResult.DescribeConfigsResourceResult
    synonym_cls = entry_cls.DescribeConfigsSynonym
    with_synonyms = ctx.version >= 1 and request.include_synonyms
    results = []
    for res in request.resources:
        result = cls.DescribeConfigsResult(error_code=ErrorCode.NONE, error_message=None,
                                           resource_type=res.resource_type, resource_name=res.resource_name,
                                           configs=[])
        if not _authorized(ctx, Operation.DESCRIBE_CONFIGS, res.resource_type, res.resource_name):
            result.error_code, result.error_message = _refusal(res.resource_type)
            results.append(result)
            continue
        try:
            values = _resource_configs(ctx, res.resource_type, res.resource_name)
        except TopicError as exc:
            result.error_code, result.error_message, values = exc.code, str(exc), {}
        keys = res.configuration_keys
        for name, described in values.items():
            if keys is not None and name not in keys:
                continue
            synonyms = [synonym_cls(name=n, value=v, source=src) for n, v, src in described.synonyms] \
                if with_synonyms else []
            # Broker configs cannot be altered at run time (read-only); topic configs can.
            result.configs.append(entry_cls(name=name, value=described.value, read_only=res.resource_type == BROKER,
                                            config_source=described.source,
                                            is_default=described.source == DEFAULT_CONFIG, is_sensitive=False,
                                            synonyms=synonyms, config_type=described.kind, documentation=None))
        results.append(result)
    return cls(throttle_time_ms=0, results=results)


async def list_config_resources(ctx: RequestContext,
                                request: ListConfigResourcesRequest) -> ListConfigResourcesResponse:
    """ListConfigResources (key 74). v0 lists client-metrics subscriptions only; v1 the types asked for, all when
    none is. kop has configs for topics and its one broker; it has no broker loggers, client-metrics subscriptions
    or group configs to list, so those types answer no resources."""
    cls = ListConfigResourcesResponse[ctx.version]
    if not ctx.authorized_on_cluster(Operation.DESCRIBE_CONFIGS):
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, config_resources=[])
    types = set(request.resource_types) if ctx.version >= 1 else {CLIENT_METRICS}
    types = types or {TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP}
    if not types <= {TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP}:
        return cls(throttle_time_ms=0, error_code=ErrorCode.UNSUPPORTED_VERSION, config_resources=[])
    resources = []
    if BROKER in types:
        resources.append(cls.ConfigResource(resource_name=str(ctx.config.node_id), resource_type=BROKER))
    if TOPIC in types:
        names = sorted([*ctx.topics.topics, internal_topics.CONSUMER_OFFSETS])
        resources += [cls.ConfigResource(resource_name=name, resource_type=TOPIC) for name in names]
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, config_resources=resources)


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
                raise unknown_topic(res.resource_name)
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
    (ListConfigResourcesRequest.API_KEY, 0, 1, list_config_resources),
]
