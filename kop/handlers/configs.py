"""DescribeConfigs (key 32), AlterConfigs (key 33), IncrementalAlterConfigs (key 44) and ListConfigResources
(key 74). Version notes: DescribeConfigs v1+ config sources and synonyms, v3+ types and documentation. Resource
types: 2 = topic, 4 = broker. Values are the ones in force, each with its true source and, as synonyms, every level
that sets it, most specific first: a topic's override (DYNAMIC_TOPIC_CONFIG), this broker's dynamic config
(DYNAMIC_BROKER_CONFIG), the cluster-wide dynamic default (DYNAMIC_DEFAULT_BROKER_CONFIG), what the properties file or
command line set (STATIC_BROKER_CONFIG), the default (DEFAULT_CONFIG). Topic configs can be altered; broker configs
whose update mode is not read-only (kop/dynamic) too, on this broker's resource or the cluster-wide default (the
broker resource with an empty name), which DescribeConfigs reports alone, as Kafka does."""
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest,
                                  DescribeConfigsResponse, IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse, ListConfigResourcesRequest,
                                  ListConfigResourcesResponse)

from kop import internal_topics
from kop.compaction.settings import DEFAULTS as COMPACTION
from kop.config import READ_ONLY, BrokerConfig
from kop.dynamic import DEFAULT_LEVEL, BrokerConfigError
from kop.dynamic.keys import DYNAMIC_FIELDS, STORED_ONLY, setting_text, update_mode
from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from kop.topics import TOPIC_CONFIG_DEFAULTS, TopicError, unknown_topic
from protocol.errors import ErrorCode

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
# Kafka's ConfigSource codes
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = \
    1, 2, 3, 4, 5
# Kafka's ConfigType codes
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
KINDS = {"BOOLEAN": BOOLEAN, "STRING": STRING, "INT": INT, "LONG": LONG, "DOUBLE": DOUBLE, "LIST": LIST}
DEFAULTS = BrokerConfig()
LONG_MAX = str(2**63 - 1)


@dataclass(frozen=True)
class Described:
    """One config as DescribeConfigs reports it: its value in force, its type and source, and its synonyms (the
    settings it comes from, most specific first: the topic's override, then the broker's setting or default)."""

    value: str | None
    kind: int
    source: int
    synonyms: tuple[tuple[str, str | None, int], ...]  # (name, value, source)
    read_only: bool = False  # cannot be altered


@dataclass(frozen=True)
class BrokerSetting:
    name: str  # Kafka's name
    kind: int
    fields: tuple[str, ...]  # the BrokerConfig fields it comes from; none: a fixed value of a single broker
    render: Callable[[BrokerConfig, RequestContext], str]  # its value under some settings


def _field(name: str) -> Callable[[BrokerConfig, RequestContext], str]:
    return lambda config, _ctx: setting_text(getattr(config, name))


def _fixed(value: str) -> Callable[[BrokerConfig, RequestContext], str]:
    return lambda _config, _ctx: value


def _setting(name: str, kind: int, field: str) -> BrokerSetting:
    return BrokerSetting(name, kind, (field,), _field(field))


BROKER_SETTINGS = (
    _setting("broker.id", INT, "node_id"),
    BrokerSetting("advertised.listeners", STRING, ("host", "port", "advertised_host", "advertised_port", "listeners"),
                  lambda _config, ctx: f"{ctx.endpoint.listener}://{ctx.endpoint.host}:{ctx.endpoint.port}"),
    _setting("num.partitions", INT, "num_partitions"),
    _setting("auto.create.topics.enable", BOOLEAN, "auto_create_topics"),
    _setting("max.partitions.per.topic", INT, "max_partitions_per_topic"),
    _setting("message.max.bytes", INT, "message_max_bytes"),
    _setting("max.connections", INT, "max_connections"),
    _setting("max.connections.per.ip", INT, "max_connections_per_ip"),
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
    _setting("group.min.session.timeout.ms", INT, "group_min_session_timeout_ms"),
    _setting("group.max.session.timeout.ms", INT, "group_max_session_timeout_ms"),
    _setting("group.initial.rebalance.delay.ms", INT, "group_initial_rebalance_delay_ms"),
    _setting("group.max.size", INT, "group_max_size"),
    _setting("group.consumer.session.timeout.ms", INT, "group_consumer_session_timeout_ms"),
    _setting("group.consumer.heartbeat.interval.ms", INT, "group_consumer_heartbeat_interval_ms"),
    _setting("group.consumer.assignors", LIST, "group_consumer_assignors"),
    _setting("group.consumer.migration.policy", STRING, "group_consumer_migration_policy"),
    _setting("offset.metadata.max.bytes", INT, "offset_metadata_max_bytes"),
    _setting("transaction.max.timeout.ms", INT, "transaction_max_timeout_ms"),
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


def _broker_setting(ctx: RequestContext, setting: BrokerSetting) -> Described:
    """Its value in force; as synonyms, each level that sets it: this broker's dynamic config, the cluster-wide
    dynamic default, the properties file or command line, the default (Kafka's order)."""
    settings = ctx.services.settings
    name, value = setting.name, setting.render(ctx.config, ctx)
    read_only = update_mode(name) == READ_ONLY
    if len(setting.fields) != 1:  # a fixed value, or one made of several settings
        explicit = any(f in settings.explicit for f in setting.fields)
        source = STATIC_BROKER_CONFIG if explicit else DEFAULT_CONFIG
        return Described(value, setting.kind, source, ((name, value, source),), read_only)
    levels = ((settings.level(settings.node), DYNAMIC_BROKER_CONFIG),
              (settings.level(DEFAULT_LEVEL), DYNAMIC_DEFAULT_BROKER_CONFIG))
    synonyms = [(name, level[name], source) for level, source in levels if name in level]
    if setting.fields[0] in settings.explicit:
        synonyms.append((name, setting.render(settings.static, ctx), STATIC_BROKER_CONFIG))
    synonyms.append((name, setting.render(DEFAULTS, ctx), DEFAULT_CONFIG))
    return Described(value, setting.kind, synonyms[0][2], tuple(synonyms), read_only)


def _stored_only(name: str, value: str, source: int) -> Described:
    """A Kafka key kop stores without acting on it (kop/dynamic/keys.py), as set at one level."""
    spec = STORED_ONLY[name]
    synonyms = [(name, value, source)]
    if source == DYNAMIC_BROKER_CONFIG and spec.default is not None:
        synonyms.append((name, spec.default, DEFAULT_CONFIG))
    return Described(value, KINDS[spec.kind], source, tuple(synonyms))


def _broker_configs(ctx: RequestContext) -> dict[str, Described]:
    out = {setting.name: _broker_setting(ctx, setting) for setting in BROKER_SETTINGS}
    settings = ctx.services.settings
    out.update((name, _stored_only(name, value, DYNAMIC_BROKER_CONFIG))
               for name, value in settings.level(settings.node).items() if name in STORED_ONLY)
    return out


def _cluster_default_configs(ctx: RequestContext) -> dict[str, Described]:
    """The cluster-wide dynamic default alone (the broker resource with an empty name), as Kafka reports it."""
    out = {}
    for name, value in ctx.services.settings.level(DEFAULT_LEVEL).items():
        setting = BROKER_SETTINGS_BY_NAME.get(name)
        source = DYNAMIC_DEFAULT_BROKER_CONFIG
        out[name] = _stored_only(name, value, source) if setting is None else \
            Described(value, setting.kind, source, ((name, value, source),))
    return out


def _topic_configs(ctx: RequestContext, overrides: dict[str, str]) -> dict[str, Described]:
    """A topic's override comes first (DYNAMIC_TOPIC_CONFIG); without one the value and source are the broker
    setting's, as Kafka reports them (a topic whose default the properties file set says STATIC_BROKER_CONFIG)."""
    defaults = [(name, kind, _broker_setting(ctx, BROKER_SETTINGS_BY_NAME[broker_name]))
                for name, kind, broker_name in TOPIC_SETTINGS]
    defaults += [(name, kind, Described(value, kind, DEFAULT_CONFIG, ((broker_name, value, DEFAULT_CONFIG),)))
                 for name, kind, broker_name, value in TOPIC_FIXED_DEFAULTS]
    out = {}
    for name, kind, broker in defaults:
        override = overrides.get(name)
        if override is None:
            out[name] = Described(broker.value, kind, broker.source, broker.synonyms)
        else:
            out[name] = Described(override, kind, DYNAMIC_TOPIC_CONFIG,
                                  ((name, override, DYNAMIC_TOPIC_CONFIG), *broker.synonyms))
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
        if name == DEFAULT_LEVEL:
            return _cluster_default_configs(ctx)
        if name != str(ctx.config.node_id):
            raise TopicError(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ctx.config.node_id} or "
                                                        f"empty string, but received {name}")
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
            result.configs.append(entry_cls(name=name, value=described.value, read_only=described.read_only,
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
# A resource's list configs, each with the default an APPEND or SUBTRACT starts from where it is not set (as Kafka)
TOPIC_LISTS = {name: TOPIC_CONFIG_DEFAULTS.get(name) for name in ("cleanup.policy",
                                                                   "follower.replication.throttled.replicas",
                                                                   "leader.replication.throttled.replicas")}
BROKER_LISTS = {**{s.name: s.render(DEFAULTS, None) for s in BROKER_SETTINGS if s.kind == LIST},  # type: ignore
                **{name: spec.default or "" for name, spec in STORED_ONLY.items() if spec.kind == "LIST"}}


def _incremental(current: dict[str, str], changes: Sequence[Any], lists: Mapping[str, str | None]) -> dict[str, str]:
    """IncrementalAlterConfigs' operations on a resource's configs. lists: its list configs, each with the value an
    APPEND or SUBTRACT starts from where the resource does not set it (Kafka's default)."""
    configs = dict(current)
    for change in changes:
        if change.config_operation == SET:
            configs[change.name] = change.value
        elif change.config_operation == DELETE:
            configs.pop(change.name, None)
        elif change.config_operation in (APPEND, SUBTRACT):
            if change.name not in lists:
                raise TopicError(ErrorCode.INVALID_CONFIG, f"{change.name} is not a list; cannot append or subtract")
            items = [v for v in configs.get(change.name, lists[change.name] or "").split(",") if v]
            values = [v for v in (change.value or "").split(",") if v]
            if change.config_operation == APPEND:
                items += [v for v in values if v not in items]
            else:
                items = [v for v in items if v not in values]
            configs[change.name] = ",".join(items)
        else:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"unknown config operation {change.config_operation}")
    return configs


def _check_entries(resource: Any, incremental: bool) -> None:
    """Kafka's checks of a resource's entries before anything else: each key once, a value for each but a DELETE."""
    names = [entry.name for entry in resource.configs]
    if len(set(names)) != len(names):
        raise TopicError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [entry.name for entry in resource.configs
             if entry.value is None and not (incremental and entry.config_operation == DELETE)]
    if nulls:
        raise TopicError(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")


def _new_configs(current: dict[str, str], resource: Any, incremental: bool) -> dict[str, str]:
    """The resource's configs after the request: AlterConfigs replaces them all (those left out return to what
    the next level says), IncrementalAlterConfigs changes the ones it names."""
    if not incremental:
        return {entry.name: entry.value for entry in resource.configs}
    return _incremental(current, resource.configs, BROKER_LISTS if resource.resource_type == BROKER else TOPIC_LISTS)


async def _alter_resource(ctx: RequestContext, resource: Any, incremental: bool, validate_only: bool) -> None:
    if not _authorized(ctx, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name):
        raise TopicError(*_refusal(resource.resource_type))
    _check_entries(resource, incremental)
    if resource.resource_type == BROKER:
        def change(current: dict[str, str]) -> dict[str, str]:
            try:
                return _new_configs(current, resource, incremental)
            except TopicError as exc:
                raise BrokerConfigError(exc.code, str(exc)) from None
        await ctx.services.settings.alter(resource.resource_name, change, validate_only, ctx.principal)
        return
    if resource.resource_type != TOPIC:
        raise TopicError(ErrorCode.INVALID_REQUEST, f"resource type {resource.resource_type} is not supported")
    topic = ctx.topics.get(resource.resource_name)
    if topic is None:
        raise unknown_topic(resource.resource_name)
    await ctx.topics.set_configs(resource.resource_name, _new_configs(topic.configs, resource, incremental),
                                 validate_only)


async def _alter(ctx: RequestContext, request: AlterConfigsRequest | IncrementalAlterConfigsRequest,
                 response: type[AlterConfigsResponse] | type[IncrementalAlterConfigsResponse],
                 incremental: bool) -> AlterConfigsResponse | IncrementalAlterConfigsResponse:
    cls = response[ctx.version]
    named = Counter((res.resource_type, res.resource_name) for res in request.resources)
    results = []
    for res in request.resources:
        result = cls.AlterConfigsResourceResponse(error_code=ErrorCode.NONE, error_message=None,
                                                  resource_type=res.resource_type, resource_name=res.resource_name)
        try:
            if named[(res.resource_type, res.resource_name)] > 1:
                raise TopicError(ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")
            await _alter_resource(ctx, res, incremental, request.validate_only)
        except (TopicError, BrokerConfigError) as exc:
            result.error_code, result.error_message = exc.code, str(exc)
        results.append(result)
    return cls(throttle_time_ms=0, responses=results)


async def alter_configs(ctx: RequestContext, request: AlterConfigsRequest) -> AlterConfigsResponse:
    return await _alter(ctx, request, AlterConfigsResponse, incremental=False)


async def incremental_alter_configs(ctx: RequestContext,
                                    request: IncrementalAlterConfigsRequest) -> IncrementalAlterConfigsResponse:
    return await _alter(ctx, request, IncrementalAlterConfigsResponse, incremental=True)


ROUTES = [
    (DescribeConfigsRequest.API_KEY, 0, 4, describe_configs),
    (AlterConfigsRequest.API_KEY, 0, 2, alter_configs),
    (IncrementalAlterConfigsRequest.API_KEY, 0, 1, incremental_alter_configs),
    (ListConfigResourcesRequest.API_KEY, 0, 1, list_config_resources),
]
