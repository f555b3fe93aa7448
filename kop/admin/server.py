"""The admin HTTP server of one broker: Pulsar's admin REST paths for deduplication policies and topic stats, and the
health, readiness and metrics probes."""
import logging
from typing import TYPE_CHECKING

from kop.admin.cluster_routes import ClusterRoutes
from kop.admin.auth import AdminAuth
from kop.admin.failpoint_routes import FailpointRoutes
from kop.admin.group_routes import GroupRoutes
from kop.admin.http import HttpError, HttpServer, Request, Response
from kop.admin.policy_routes import PolicyRoutes
from kop.admin.probe_routes import PROBE_PATHS, ProbeRoutes
from kop.admin.router import AdminRouter
from kop.admin.topic_routes import TopicRoutes
from kop.admin.user_routes import UserRoutes

if TYPE_CHECKING:
    from kop.broker import Broker

log = logging.getLogger(__name__)


def build_admin_router(broker: "Broker") -> AdminRouter:
    router = AdminRouter()
    for routes in (ProbeRoutes(broker), PolicyRoutes(broker), TopicRoutes(broker), ClusterRoutes(broker),
                   GroupRoutes(broker), UserRoutes(broker), FailpointRoutes(broker)):
        routes.register(router)
    return router


class AdminServer:
    """Serves on `config.admin_port` (-1: any free port) at `config.admin_host`; `port` is the port bound."""

    def __init__(self, broker: "Broker") -> None:
        config = broker.config
        self._broker = broker
        self.router = build_admin_router(broker)
        self._auth = AdminAuth(broker.users, broker.authorizer, config.admin_token,
                               config.admin_authentication_enabled)
        self._http = HttpServer(self._handle, config.admin_host, max(config.admin_port, 0))

    async def _handle(self, request: Request) -> Response:
        """Until the topics are loaded only the probes answer: anything else would see half the broker."""
        await self._auth.check(request, exempt=PROBE_PATHS)
        if not self._broker.loaded and request.path not in PROBE_PATHS:
            raise HttpError(503, "the broker is loading its topics; retry")
        return await self.router(request)

    @property
    def port(self) -> int:
        return self._http.port

    async def bind(self) -> None:
        """Take the port; nothing is served until `start`. OSError when the port cannot be had."""
        await self._http.bind()

    async def start(self) -> None:
        await self._http.start()
        log.info("kop admin API on http://%s:%d", self._http.host, self.port)

    async def stop(self) -> None:
        await self._http.close()
