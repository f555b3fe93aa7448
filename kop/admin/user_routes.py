"""The user store over the admin API: `GET /admin/v2/users` lists users with their SCRAM mechanisms and iteration
counts (never a key), `POST /admin/v2/users/{user}` with `{"password": "...", "iterations": N}` gives the user
SCRAM-SHA-256 and SCRAM-SHA-512 credentials from that password (also what SASL PLAIN checks), `DELETE` removes them.
The password crosses the admin connection once and is not kept."""
from typing import TYPE_CHECKING

from kop.admin.http import HttpError, Request, Response, json_response
from kop.admin.parsing import json_body
from kop.admin.router import AdminRouter
from kop.security.users import DEFAULT_ITERATIONS, CredentialError

if TYPE_CHECKING:
    from kop.broker import Broker

USERS = "/admin/v2/users"


class UserRoutes:
    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    def register(self, router: AdminRouter) -> None:
        router.add("GET", USERS, self.list_users)
        router.add("POST", f"{USERS}/{{user}}", self.set_password)
        router.add("DELETE", f"{USERS}/{{user}}", self.delete)

    async def list_users(self, request: Request) -> Response:
        return json_response({user: [{"mechanism": c.mechanism, "iterations": c.iterations} for c in credentials]
                              for user, credentials in self.broker.users.users().items()})

    async def set_password(self, request: Request, user: str) -> Response:
        body = json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("password"), str):
            raise HttpError(400, 'expected {"password": "...", "iterations": N}')
        iterations = body.get("iterations", DEFAULT_ITERATIONS)
        if not isinstance(iterations, int) or isinstance(iterations, bool):
            raise HttpError(400, "iterations must be an integer")
        try:
            await self.broker.users.set_password(user, body["password"], iterations)
        except CredentialError as exc:
            raise HttpError(400, str(exc)) from None
        except OSError as exc:
            raise HttpError(503, f"not stored: {exc}") from None
        return await self.list_users(request)

    async def delete(self, request: Request, user: str) -> Response:
        try:
            deleted = await self.broker.users.delete(user)
        except OSError as exc:
            raise HttpError(503, f"not stored: {exc}") from None
        if not deleted:
            raise HttpError(404, f"no such user: {user}")
        return await self.list_users(request)
