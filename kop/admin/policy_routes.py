"""Deduplication policies at namespace and topic level, on Pulsar's REST paths.

GET answers the value set at that level (`null` when unset) or, with `?applied=true`, the value in force there
(topic -> namespace -> broker). POST sets it, DELETE removes it (falling back to the next level); both answer 204
once the partitions follow the new policy, so a status read right after sees it.
"""
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kop.admin.http import HttpError, Request, Response, json_response
from kop.admin.parsing import bool_body, check_namespace, find_topic, flag_query, int_value, json_body
from kop.admin.router import AdminRouter
from kop.policies import field_value
from kop.replication.clusters import CLUSTER_NAME

if TYPE_CHECKING:
    from kop.broker import Broker

NAMESPACE = "/admin/v2/namespaces/{tenant}/{namespace}"
TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NO_CONTENT = Response(204)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PolicyField:
    field: str  # the Policies field (kop.policies.FIELDS)
    namespace_path: str  # Pulsar's path segment at namespace level
    topic_path: str  # ... and at topic level
    parse: Callable[[Request], object]
    changes_status: bool  # whether partitions must be brought in line after a change


def _interval_body(request: Request) -> int:
    return int_value(json_body(request), "the snapshot interval (seconds)")


def _ttl_body(request: Request) -> int:
    return int_value(json_body(request), "the message TTL (seconds, 0: never)")


def _clusters_body(request: Request) -> list[str]:
    """A JSON list of cluster names (Pulsar's body for `replication`)."""
    value = json_body(request)
    if not isinstance(value, list) or not all(isinstance(v, str) and CLUSTER_NAME.fullmatch(v) for v in value):
        raise HttpError(400, f"expected a list of cluster names, got {json.dumps(value)[:100]}")
    return list(dict.fromkeys(value))


FIELDS = (
    PolicyField("deduplication_enabled", "deduplication", "deduplicationEnabled", bool_body, True),
    PolicyField("deduplication_snapshot_interval_seconds", "deduplicationSnapshotInterval",
                "deduplicationSnapshotInterval", _interval_body, False),
    PolicyField("replication_clusters", "replication", "replication", _clusters_body, False),
    PolicyField("replicated_subscriptions", "replicatedSubscriptions", "replicatedSubscriptions", bool_body, False),
    PolicyField("message_ttl_seconds", "messageTTL", "messageTTL", _ttl_body, False),
)


class PolicyRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        for spec in FIELDS:
            self._register_namespace(router, spec)
            self._register_topic(router, spec)

    # ---- namespace level

    def _register_namespace(self, router: AdminRouter, spec: PolicyField) -> None:
        path = f"{NAMESPACE}/{spec.namespace_path}"
        policies = self.broker.policies

        async def get(request: Request, tenant: str, namespace: str) -> Response:
            ns = check_namespace(self.broker, tenant, namespace)
            value = _field_value(policies.get("namespace", ns), spec.field)
            if value is None and flag_query(request, "applied"):
                value = self._broker_default(spec)
            return json_response(value)

        async def post(request: Request, tenant: str, namespace: str) -> Response:
            ns = check_namespace(self.broker, tenant, namespace)
            await self._change("namespace", ns, spec, spec.parse(request))
            return await self._applied(spec, None)

        async def delete(request: Request, tenant: str, namespace: str) -> Response:
            ns = check_namespace(self.broker, tenant, namespace)
            await self._change("namespace", ns, spec, None)
            return await self._applied(spec, None)

        router.add("GET", path, get)
        router.add("POST", path, post)
        router.add("DELETE", path, delete)

    # ---- topic level

    def _register_topic(self, router: AdminRouter, spec: PolicyField) -> None:
        path = f"{TOPIC}/{spec.topic_path}"
        policies = self.broker.policies

        async def get(request: Request, tenant: str, namespace: str, topic: str) -> Response:
            ref = find_topic(self.broker, tenant, namespace, topic)
            if flag_query(request, "applied"):
                return json_response(_jsonable(getattr(policies.resolve(ref.topic), spec.field)))
            return json_response(_field_value(policies.get("topic", policies.topic_key(ref.topic)), spec.field))

        async def post(request: Request, tenant: str, namespace: str, topic: str) -> Response:
            ref = find_topic(self.broker, tenant, namespace, topic)
            await self._change("topic", policies.topic_key(ref.topic), spec, spec.parse(request))
            return await self._applied(spec, ref.topic)

        async def delete(request: Request, tenant: str, namespace: str, topic: str) -> Response:
            ref = find_topic(self.broker, tenant, namespace, topic)
            await self._change("topic", policies.topic_key(ref.topic), spec, None)
            return await self._applied(spec, ref.topic)

        router.add("GET", path, get)
        router.add("POST", path, post)
        router.add("DELETE", path, delete)

    # ---- helpers

    async def _change(self, level: str, key: str, spec: PolicyField, value: object) -> None:
        """Set (None: remove) the policy at one level, and log what changed: an operator's change is an event."""
        policies = self.broker.policies
        old = _field_value(policies.get(level, key), spec.field)
        await policies.set(level, key, spec.field, value)
        log.info("admin: %s %s policy %s changed: %s -> %s", level, key, spec.field, json.dumps(old),
                 json.dumps(_jsonable(value)))

    def _broker_default(self, spec: PolicyField) -> object:
        config = self.broker.config
        return {"deduplication_enabled": config.broker_deduplication_enabled,
                "deduplication_snapshot_interval_seconds":
                    config.broker_deduplication_snapshot_interval_seconds,
                "replication_clusters": [], "replicated_subscriptions": False,
                "message_ttl_seconds": config.ttl_duration_default_in_seconds}[spec.field]

    async def _applied(self, spec: PolicyField, topic: str | None) -> Response:
        if spec.changes_status:
            await self.broker.topics.apply_policies(topic)
        await self.broker.replication.reconcile()  # the replication clusters may have changed
        return NO_CONTENT


def _field_value(policies, field: str) -> object:
    return _jsonable(field_value(policies, field))


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value
