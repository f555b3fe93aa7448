"""Reading admin requests: which namespace and topic a path names, and the JSON values in bodies and queries.

Every failure is an HttpError with Pulsar's status for it: 404 for a namespace or topic that does not exist, 400
for a body or parameter of the wrong shape.
"""
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kop.admin.http import HttpError, Request
from kop.partition import PartitionLog

if TYPE_CHECKING:
    from kop.broker import Broker

PARTITION_SUFFIX = re.compile(r"^(?P<topic>.+)-partition-(?P<index>0|[1-9][0-9]{0,8})$")
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TopicRef:
    """A Kafka topic, or one partition of it when the path named `T-partition-N`."""

    namespace: str
    topic: str
    partitions: tuple[PartitionLog, ...]
    single_partition: bool


def check_namespace(broker: "Broker", tenant: str, namespace: str) -> str:
    name = f"{tenant}/{namespace}"
    if name != broker.config.namespace.strip("/"):
        raise HttpError(404, f"Namespace {name} does not exist")
    return name


def find_topic(broker: "Broker", tenant: str, namespace: str, topic: str, *, partition_names: bool = False) -> TopicRef:
    """The topic a path names; with `partition_names`, `T-partition-N` names partition N of T (as in Pulsar)."""
    ns = check_namespace(broker, tenant, namespace)
    found = broker.topics.get(topic)
    if found is not None:
        return TopicRef(ns, found.name, tuple(found.partitions), False)
    match = PARTITION_SUFFIX.match(topic) if partition_names else None
    if match is not None:
        parent = broker.topics.get(match["topic"])
        index = int(match["index"])
        partition = parent.partition(index) if parent is not None else None
        if partition is not None:  # not here when another broker of the cluster owns it
            return TopicRef(ns, parent.name, (partition,), True)
    raise HttpError(404, f"Topic persistent://{ns}/{topic} not found")


def json_body(request: Request) -> object:
    if not request.body.strip():
        raise HttpError(400, "a JSON body is required")
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError) as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None


def bool_body(request: Request) -> bool:
    value = json_body(request)
    if not isinstance(value, bool):
        raise HttpError(400, f"expected true or false, got {json.dumps(value)[:100]}")
    return value


def int_value(value: object, what: str, minimum: int = 0, maximum: int = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"{what} must be an integer, got {json.dumps(value)[:100]}")
    if not minimum <= value <= maximum:
        raise HttpError(400, f"{what} must be in {minimum}..{maximum}, got {value}")
    return value


def flag_query(request: Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in ("true", "false"):
        raise HttpError(400, f"query parameter {name} must be true or false, got {raw!r}")
    return raw == "true"
