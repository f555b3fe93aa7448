"""A consumer group's PIP-33 replication flag: `GET /admin/v2/groups/{group}/replicated` answers whether its position
is replicated to the other clusters, POST with true or false turns it on or off. The flag is stored as Pulsar
stores it, the cursor property `pulsar.replicated.subscription=1` on each of the group's partitions (its later
commits keep it); a group with no commit yet keeps it in a file until its first commit (kop/groups/offsets.py). On
PostgreSQL the group's coordinator sets it (kop/cluster/offsets.py): another broker of the cluster answers 409."""
import logging
from typing import TYPE_CHECKING

from kop.admin.http import HttpError, Request, Response, json_response
from kop.admin.parsing import bool_body
from kop.admin.router import AdminRouter
from kop.groups.offsets import NotCoordinated

if TYPE_CHECKING:
    from kop.broker import Broker

PATH = "/admin/v2/groups/{group}/replicated"
log = logging.getLogger(__name__)


class GroupRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        router.add("GET", PATH, self.get)
        router.add("POST", PATH, self.set)

    async def get(self, request: Request, group: str) -> Response:
        return json_response(group in self.broker.groups.offsets.replicated)

    async def set(self, request: Request, group: str) -> Response:
        enabled = bool_body(request)
        try:
            changed = await self.broker.groups.offsets.set_replicated(group, enabled)
        except NotCoordinated as exc:  # a cluster of brokers on PostgreSQL: another one coordinates the group
            raise HttpError(409, str(exc)) from None
        log.info("admin: group %s replicated=%s (%d partitions changed)", group, enabled, changed)
        return json_response({"group": group, "replicated": enabled, "partitionsChanged": changed})
