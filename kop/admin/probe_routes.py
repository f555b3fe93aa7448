"""What orchestrators and Prometheus ask the admin port: `/health` (liveness: 200 whenever the event loop answers),
`/ready` (readiness: 200 once the Kafka port serves, every partition is loaded and every deduplication state is
recovered; otherwise 503 saying what is not) and `/metrics` (Prometheus text format). They answer from the moment
the admin port listens, while the topics are still loading."""
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST

from kop.admin.http import Request, Response, json_response
from kop.admin.router import AdminRouter

if TYPE_CHECKING:
    from kop.broker import Broker

PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})


class ProbeRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        router.add("GET", "/health", self.health)
        router.add("GET", "/ready", self.ready)
        router.add("GET", "/metrics", self.metrics)

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        reasons = self.broker.not_ready()
        if reasons:
            return json_response({"ready": False, "reasons": reasons}, 503)
        return json_response({"ready": True})

    async def metrics(self, request: Request) -> Response:
        return Response(200, self.broker.metrics.exposition(), content_type=CONTENT_TYPE_LATEST)
