"""Who may use the admin API. With admin.authentication.enabled, every request but the probes (/health, /ready,
/metrics) names its principal: HTTP Basic with a user and password of the broker's user store (the users SASL
authenticates), or `Authorization: Bearer <admin.token>`. Reading (GET, HEAD) needs DESCRIBE on the cluster and
changing anything ALTER, decided by the authorizer; without the authorizer only super users (and the token) may."""
import asyncio
import base64
import hmac
from dataclasses import dataclass

from kop.admin.http import HttpError, Request
from kop.security.acls import CLUSTER_NAME, Authorizer, Operation, ResourceType
from kop.security.users import UserStore

READS = frozenset({"GET", "HEAD"})
CHALLENGE = 'Basic realm="kop admin", charset="UTF-8"'


class Unauthenticated(HttpError):
    """401: the answer carries the challenge that tells a client to send credentials."""

    def __init__(self, reason: str) -> None:
        super().__init__(401, reason)
        self.headers = {"WWW-Authenticate": CHALLENGE}


@dataclass(frozen=True)
class AdminAuth:
    users: UserStore
    authorizer: Authorizer
    token: str  # "" for none
    enabled: bool

    async def check(self, request: Request, exempt: frozenset[str]) -> None:
        """Raises Unauthenticated (401) or HttpError 403 unless the request may be served. A password is checked in
        a worker thread (PBKDF2 takes milliseconds, and the event loop serves every client)."""
        if not self.enabled or request.path in exempt:
            return
        user, password = self.credentials(request)
        if user is None:  # the admin token
            return
        if not await asyncio.to_thread(self.users.check_password, user, password):
            raise Unauthenticated("invalid user or password")
        principal = f"User:{user}"
        operation = Operation.DESCRIBE if request.method in READS else Operation.ALTER
        if self.authorizer.enabled:
            allowed = self.authorizer.authorize(principal, request.peer_host, operation, ResourceType.CLUSTER,
                                                CLUSTER_NAME)
        else:
            allowed = self.authorizer.is_super_user(principal)
        if not allowed:
            raise HttpError(403, f"{principal} may not {operation.name} the cluster")

    def credentials(self, request: Request) -> tuple[str | None, str]:
        """The user and password of HTTP Basic credentials, or (None, "") for the admin token; raises
        Unauthenticated for anything else."""
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.token:
            if hmac.compare_digest(credentials.strip().encode(), self.token.encode()):
                return None, ""
            raise Unauthenticated("the token is not admin.token")
        if scheme.lower() != "basic":
            raise Unauthenticated("credentials required: HTTP Basic (a kop user) or a Bearer token")
        try:
            user, sep, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except ValueError:  # not base64 (binascii.Error), not ASCII (the header is read as latin-1), not UTF-8
            raise Unauthenticated("malformed Basic credentials") from None
        if not sep:
            raise Unauthenticated("malformed Basic credentials: no colon between user and password")
        return user, password
