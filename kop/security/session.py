"""A connection's security state: who the client is and whether it may send requests yet.

On a SASL listener a connection starts unauthenticated: only ApiVersions, SaslHandshake and SaslAuthenticate are
served, each request within sasl.server.max.receive.size bytes and at most MAX_UNAUTHENTICATED_REQUESTS of them.
Once authenticated, the session lasts connections.max.reauth.ms (0: for ever), or until the credential expires (an
OAUTHBEARER token) if that comes first; the client re-authenticates on the same connection before then (KIP-368), and a request other than those three after it has ended closes the
connection. On other listeners the principal is fixed at connect: the client certificate's subject, or ANONYMOUS.
"""
import asyncio
import time
from dataclasses import dataclass, field

from kop.security.listeners import ListenerSpec
from kop.security.sasl import AuthenticationFailed, SaslExchange, Step

ANONYMOUS = "User:ANONYMOUS"
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
AUTHENTICATION_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
# ApiVersions, SaslHandshake and two SCRAM rounds make four; the rest is slack for clients that ask twice
MAX_UNAUTHENTICATED_REQUESTS = 16


class SessionClosed(Exception):
    """The connection must close: the reason is logged."""


@dataclass
class Session:
    listener: ListenerSpec
    principal: str = ANONYMOUS
    authenticated: bool = False
    mechanism: str | None = None  # of the first authentication: re-authentication must use the same one
    exchange: SaslExchange | None = None  # an authentication under way
    raw_tokens: bool = False  # after SaslHandshake v0 the tokens come as bare frames, without Kafka headers
    expires_at: float | None = None  # time.monotonic() when the session ends
    lifetime_ms: int = 0  # what the last authentication granted (SaslAuthenticate's session_lifetime_ms), 0: no end
    close_after_response: bool = False  # a failed authentication: answer, then close
    unauthenticated_requests: int = field(default=0)

    @classmethod
    def start(cls, listener: ListenerSpec, certificate_subject: str | None) -> "Session":
        if listener.sasl:
            return cls(listener)
        return cls(listener, f"User:{certificate_subject}" if certificate_subject else ANONYMOUS, authenticated=True)

    def admit(self, api_key: int) -> None:
        """Raises SessionClosed when this request may not be served now."""
        if not self.listener.sasl:
            return
        if api_key in AUTHENTICATION_APIS:
            if not self.authenticated:
                self.unauthenticated_requests += 1
                if self.unauthenticated_requests > MAX_UNAUTHENTICATED_REQUESTS:
                    raise SessionClosed(f"{MAX_UNAUTHENTICATED_REQUESTS} requests without authenticating")
            return
        if not self.authenticated:
            raise SessionClosed(f"request (api key {api_key}) before SASL authentication")
        if self.expires_at is not None and time.monotonic() >= self.expires_at:
            raise SessionClosed(f"the SASL session of {self.principal} expired (connections.max.reauth.ms)")

    @property
    def receiving_limit_applies(self) -> bool:
        return self.listener.sasl and not self.authenticated

    def begin(self, exchange: SaslExchange, raw_tokens: bool) -> None:
        self.exchange = exchange
        self.raw_tokens = raw_tokens

    async def advance(self, token: bytes, max_lifetime_ms: int) -> Step:
        """`step`, in a worker thread when the exchange derives a key from a password: every connection shares the
        event loop, and a client that has not authenticated must not stall it for the milliseconds PBKDF2 takes.
        The connection reads its next request only once this one's ordered phase is done, so nothing else touches
        the session meanwhile."""
        if self.exchange is not None and self.exchange.derives_keys:
            return await asyncio.to_thread(self.step, token, max_lifetime_ms)
        return self.step(token, max_lifetime_ms)

    def step(self, token: bytes, max_lifetime_ms: int) -> Step:
        """One client token of the exchange under way; raises AuthenticationFailed (and the connection closes). The
        session lasts max_lifetime_ms (connections.max.reauth.ms, 0: no limit) or until the credential expires,
        whichever comes first (KIP-368)."""
        if self.exchange is None:
            raise AuthenticationFailed("SaslAuthenticate without a SaslHandshake first")
        try:
            step = self.exchange.step(token)
        except AuthenticationFailed:
            self.close_after_response = True
            raise
        if step.user is not None:
            self._authenticated(f"User:{step.user}", _lifetime_ms(max_lifetime_ms, step.expires_at_ms))
        return step

    def _authenticated(self, principal: str, lifetime_ms: int) -> None:
        if self.authenticated and principal != self.principal:
            self.close_after_response = True
            raise AuthenticationFailed(f"re-authentication as {principal} on a connection of {self.principal}")
        self.principal = principal
        self.authenticated = True
        self.mechanism = self.exchange.mechanism
        self.exchange = None
        self.raw_tokens = False
        self.lifetime_ms = lifetime_ms
        self.expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms else None


def _lifetime_ms(max_lifetime_ms: int, credential_expires_at_ms: int | None) -> int:
    if credential_expires_at_ms is None:
        return max_lifetime_ms
    # at least 1 ms: a token valid only within the allowed clock skew still ends its session (0 would mean never)
    remaining = max(1, credential_expires_at_ms - int(time.time() * 1000))
    return min(remaining, max_lifetime_ms) if max_lifetime_ms else remaining
