"""Broker configs over the wire for tests of dynamic broker configs (kop/dynamic): hand-made IncrementalAlterConfigs
and DescribeConfigs requests, which can name what the clients' admin APIs cannot (the cluster-wide default's empty
name, another broker's id, a resource twice), and auto-creation through Metadata, which shows num.partitions and
auto.create.topics.enable at work."""
from dataclasses import dataclass

from kafka.protocol.admin import (DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest,
                                  IncrementalAlterConfigsResponse)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from integration.idem_raw import RawKafka
from protocol.errors import ErrorCode

BROKER = 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
SOURCES = {1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
           4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG"}
Op = tuple[str, int, str | None]  # (key, operation, value)


@dataclass(frozen=True)
class Answer:
    error: ErrorCode
    message: str | None


def alter(port: int, name: str, *ops: Op, validate_only: bool = False) -> Answer:
    """IncrementalAlterConfigs of broker resource `name` ("" the cluster-wide default)."""
    return alter_resources(port, [(name, list(ops))], validate_only=validate_only)[0]


def alter_resources(port: int, resources: list[tuple[str, list[Op]]], validate_only: bool = False) -> list[Answer]:
    Resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest[1](validate_only=validate_only, resources=[
        Resource(resource_type=BROKER, resource_name=name, configs=[
            Resource.AlterableConfig(name=key, config_operation=op, value=value) for key, op, value in ops])
        for name, ops in resources])
    with RawKafka(port) as kafka:
        response = kafka.call(request, IncrementalAlterConfigsResponse, 1)
    return [Answer(ErrorCode(r.error_code), r.error_message) for r in response.responses]


def describe(port: int, name: str) -> tuple[ErrorCode, dict[str, dict]]:
    """DescribeConfigs v4 of broker resource `name` with synonyms: (error, key -> value, source, read_only and
    synonyms as (name, value, source))."""
    request = DescribeConfigsRequest[4](include_synonyms=True, include_documentation=False, resources=[
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=BROKER, resource_name=name,
                                                       configuration_keys=None)])
    with RawKafka(port) as kafka:
        (result,) = kafka.call(request, DescribeConfigsResponse, 4).results
    return ErrorCode(result.error_code), {
        c.name: {"value": c.value, "source": SOURCES[c.config_source], "read_only": c.read_only,
                 "synonyms": [(s.name, s.value, SOURCES[s.source]) for s in c.synonyms]} for c in result.configs}


def auto_create(port: int, topic: str) -> tuple[ErrorCode, int]:
    """Metadata for `topic` asking for it to be created as auto-creation would: (its error, its partition count)."""
    request = MetadataRequest[9](topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                                 allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
                                 include_topic_authorized_operations=False)
    with RawKafka(port) as kafka:
        (answer,) = kafka.call(request, MetadataResponse, 9).topics
    return ErrorCode(answer.error_code), len(answer.partitions)
