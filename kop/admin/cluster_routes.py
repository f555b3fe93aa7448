"""The clusters registry on Pulsar's REST paths: `GET /admin/v2/clusters` lists the names;
`/admin/v2/clusters/{cluster}` is read with GET, created with PUT, updated with POST (a JSON object with
`brokerServiceUrl`, HOST:PORT of the cluster's Kafka listener, and optionally `serviceUrl`, its admin API, and how
to reach the listener: `securityProtocol`, `saslMechanism`, `saslUsername`, `saslPassword`, `sslCaFile`) and
removed with DELETE. The password is never shown. The replicators follow a change at once."""
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from kop.admin.http import HttpError, Request, Response, json_response
from kop.admin.parsing import json_body
from kop.admin.router import AdminRouter
from kop.replication.clusters import (Cluster, ClusterError, ClusterExists, LinkSecurity, UnknownCluster,
                                      check_cluster)

if TYPE_CHECKING:
    from kop.broker import Broker

CLUSTERS = "/admin/v2/clusters"
NO_CONTENT = Response(204)
log = logging.getLogger(__name__)


SECURITY_KEYS = {"securityProtocol": "protocol", "saslMechanism": "sasl_mechanism", "saslUsername": "sasl_username",
                 "saslPassword": "sasl_password", "sslCaFile": "ssl_ca_file"}  # JSON key -> LinkSecurity field


def _cluster_body(request: Request, name: str) -> Cluster:
    body = json_body(request)
    optional = ("serviceUrl", *SECURITY_KEYS)
    if not isinstance(body, dict) or not isinstance(body.get("brokerServiceUrl"), str) \
            or not all(isinstance(body.get(key, ""), str) for key in optional):
        raise HttpError(400, 'expected {"brokerServiceUrl": "HOST:PORT", "serviceUrl": "http://HOST:PORT"} and '
                             f'optionally string values of {", ".join(SECURITY_KEYS)}')
    security = LinkSecurity(**{field: body[key] for key, field in SECURITY_KEYS.items() if body.get(key)})
    try:
        return check_cluster(name, body["brokerServiceUrl"], body.get("serviceUrl", ""), security)
    except ClusterError as exc:
        raise HttpError(400, str(exc)) from None


class ClusterRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        router.add("GET", CLUSTERS, self.list_)
        router.add("GET", f"{CLUSTERS}/{{cluster}}", self.get)
        router.add("PUT", f"{CLUSTERS}/{{cluster}}", self.create)
        router.add("POST", f"{CLUSTERS}/{{cluster}}", self.update)
        router.add("DELETE", f"{CLUSTERS}/{{cluster}}", self.delete)

    async def list_(self, request: Request) -> Response:
        return json_response(sorted(self.broker.clusters.clusters))

    async def get(self, request: Request, cluster: str) -> Response:
        found = self.broker.clusters.get(cluster)
        if found is None:
            raise HttpError(404, f"Cluster {cluster} does not exist")
        return json_response(found.to_json())

    async def create(self, request: Request, cluster: str) -> Response:
        found = _cluster_body(request, cluster)
        return await self._change(f"{found} created", self.broker.clusters.create(found))

    async def update(self, request: Request, cluster: str) -> Response:
        found = _cluster_body(request, cluster)
        return await self._change(f"{found} updated", self.broker.clusters.update(found))

    async def delete(self, request: Request, cluster: str) -> Response:
        return await self._change(f"{cluster} deleted", self.broker.clusters.delete(cluster))

    async def _change(self, what: str, change: Awaitable[None]) -> Response:
        try:
            await change
        except UnknownCluster as exc:
            raise HttpError(404, str(exc)) from None
        except ClusterExists as exc:
            raise HttpError(409, str(exc)) from None
        except OSError as exc:
            raise HttpError(503, f"not stored: {exc}") from None
        log.info("admin: cluster %s", what)
        await self.broker.replication.reconcile()
        return NO_CONTENT
