"""DescribeCluster (key 60) and DescribeConfigs (key 32). Version notes: DescribeCluster v1 adds the endpoint type;
DescribeConfigs v1+ config sources and synonyms, v3+ types and documentation. Resource types: 2 = topic, 4 = broker.
Values are the ones in force: topic overrides first, then the broker's defaults."""
from protocol.api import response_class
from protocol.errors import ErrorCode

TOPIC, BROKER = 2, 4
# Kafka's ConfigSource codes
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# Kafka's ConfigType codes
BOOLEAN, STRING, INT, LONG = 1, 2, 3, 5


def _broker_configs(config) -> dict[str, tuple[str, int]]:
    return {
        "broker.id": (str(config.node_id), INT),
        "num.partitions": (str(config.num_partitions), INT),
        "auto.create.topics.enable": (str(config.auto_create_topics).lower(), BOOLEAN),
        "message.max.bytes": (str(config.message_max_bytes), INT),
        "socket.request.max.bytes": (str(config.socket_request_max_bytes), INT),
        "log.retention.ms": (str(config.retention_ms), LONG),
        "log.retention.bytes": (str(config.retention_bytes), LONG),
        "log.segment.bytes": (str(config.ledger_max_bytes), INT),
        "default.replication.factor": ("1", INT),
        "min.insync.replicas": ("1", INT),
        "brokerDeduplicationEnabled": (str(config.broker_deduplication_enabled).lower(), BOOLEAN),
        "brokerDeduplicationEntriesInterval": (str(config.broker_deduplication_entries_interval), INT),
        "brokerDeduplicationSnapshotIntervalSeconds":
            (str(config.broker_deduplication_snapshot_interval_seconds), INT),
    }


def _topic_configs(config, topic) -> dict[str, tuple[str, int, int]]:
    defaults = {
        "cleanup.policy": ("delete", STRING),
        "retention.ms": (str(config.retention_ms), LONG),
        "retention.bytes": (str(config.retention_bytes), LONG),
        "max.message.bytes": (str(config.message_max_bytes), INT),
        "segment.bytes": (str(config.ledger_max_bytes), INT),
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
    return out


async def describe_configs(ctx, request):
    cls = response_class(32, ctx.version)
    entry_cls = cls.DescribeConfigsResult.DescribeConfigsResourceResult
    results = []
    for res in request.resources:
        result = cls.DescribeConfigsResult(error_code=0, error_message=None, resource_type=res.resource_type,
                                           resource_name=res.resource_name, configs=[])
        if res.resource_type == TOPIC:
            topic = ctx.broker.topics.get(res.resource_name)
            if topic is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"unknown topic {res.resource_name!r}"
                values = {}
            else:
                values = _topic_configs(ctx.broker.config, topic)
        elif res.resource_type == BROKER:
            if res.resource_name not in ("", str(ctx.broker.config.node_id)):
                result.error_code = ErrorCode.INVALID_REQUEST
                result.error_message = f"unknown broker {res.resource_name!r}"
                values = {}
            else:
                values = {k: (v, t, STATIC_BROKER_CONFIG) for k, (v, t) in _broker_configs(ctx.broker.config).items()}
        else:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"resource type {res.resource_type} is not supported"
            values = {}
        keys = res.configuration_keys
        for name, (value, kind, source) in values.items():
            if keys is not None and name not in keys:
                continue
            result.configs.append(entry_cls(name=name, value=value, read_only=source != DYNAMIC_TOPIC_CONFIG,
                                            config_source=source, is_default=source == DEFAULT_CONFIG,
                                            is_sensitive=False, synonyms=[], config_type=kind, documentation=None))
        results.append(result)
    return cls(throttle_time_ms=0, results=results)


async def describe_cluster(ctx, request):
    cls = response_class(60, ctx.version)
    cfg = ctx.broker.config
    return cls(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1, cluster_id=cfg.cluster_id,
               controller_id=cfg.node_id,
               brokers=[cls.DescribeClusterBroker(broker_id=cfg.node_id, host=cfg.advertised, port=ctx.broker.advertised_port,
                                                  rack=None, is_fenced=False)])


ROUTES = [
    (32, 0, 4, describe_configs),
    (60, 0, 1, describe_cluster),
]
