"""SASL OAUTHBEARER (RFC 7628) with an unsecured JWT validator, for development, as Kafka's
OAuthBearerUnsecuredValidatorCallbackHandler: the token is an unsigned JWT (`alg: none`, an empty signature) whose
claims name the principal (`sub`, or the configured claim), when it expires (`exp`, required), when it was issued
(`iat`, optional) and its scopes (`scope`, checked against the required ones). Nothing proves who made the token:
anyone who can reach the listener can claim any principal, so it is never on unless configured.

The exchange: the client's first message is `n,[a=authzid],` then `\\x01`-separated key=value pairs, one of them
`auth=Bearer <token>`, ended by `\\x01\\x01`. A valid token completes it (an empty answer); an invalid one is answered
with RFC 7628's error JSON (`{"status":"invalid_token"}`), the client acknowledges with a lone `\\x01`, and only then
does the authentication fail.
"""
import base64
import binascii
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from kop.security.sasl import AuthenticationFailed, Step

MECHANISM = "OAUTHBEARER"
_CONTROL_A = "\x01"
# RFC 7628 §3.1: gs2-header kvsep *kvpair kvsep; keys are letters, values printable ASCII with spaces and tabs
_CLIENT_FIRST = re.compile(r"n,(?:a=(?P<authzid>[^,]*))?,\x01(?P<pairs>(?:[A-Za-z]+=[\x21-\x7E \t\r\n]*\x01)*)\x01")
_BEARER = re.compile(r"[Bb]earer +(?P<token>[-._~+/A-Za-z0-9]+=*)")


class InvalidToken(Exception):
    """A token the validator refuses: `status` is RFC 7628's error code, the message says why (no secret: the token
    is the client's own, unsigned)."""

    def __init__(self, reason: str, status: str = "invalid_token", scope: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.scope = scope

    def error_json(self) -> bytes:
        error = {"status": self.status} | ({"scope": self.scope} if self.scope else {})
        return json.dumps(error, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ValidToken:
    principal: str
    expires_at_ms: int  # wall-clock, milliseconds since the epoch


@dataclass(frozen=True)
class UnsecuredValidator:
    """Kafka's unsecuredValidator* options: the claim naming the principal, the claim holding the scopes (a JSON
    array of strings, or one string of space-separated scopes), the scopes a token must have, and how far clocks
    may disagree when checking `exp` and `iat`."""

    principal_claim: str = "sub"
    scope_claim: str = "scope"
    required_scopes: frozenset[str] = frozenset()
    clock_skew_ms: int = 0

    def validate(self, token: str, now_ms: int) -> ValidToken:
        claims = _unsecured_claims(token)
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise InvalidToken(f"no principal: the token has no non-empty string claim {self.principal_claim!r}")
        expires = _time_claim(claims, "exp")
        if expires is None:
            raise InvalidToken("the token has no expiration time (exp)")
        issued = _time_claim(claims, "iat")
        if now_ms > expires + self.clock_skew_ms:
            raise InvalidToken(f"the token expired {(now_ms - expires) / 1000:.3f} s ago")
        if issued is not None and now_ms + self.clock_skew_ms < issued:
            raise InvalidToken("the token was issued in the future (iat)")
        if issued is not None and expires <= issued:
            raise InvalidToken("the token expires before it was issued (exp <= iat)")
        missing = self.required_scopes - _scopes(claims.get(self.scope_claim))
        if missing:
            raise InvalidToken(f"the token lacks the required scope {' '.join(sorted(missing))}",
                               "insufficient_scope", " ".join(sorted(self.required_scopes)))
        return ValidToken(principal.strip(), expires)


def _unsecured_claims(token: str) -> dict:
    """The claims of an unsecured JWS (RFC 7515/7519): base64url header `.` claims `.` and no signature."""
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken(f"malformed token: a JWT has 3 dot-separated parts, this has {len(parts)}")
    if parts[2]:
        raise InvalidToken("a signed token: the unsecured validator accepts only unsigned ones (empty signature)")
    header, claims = (_json_part(part, name) for part, name in zip(parts, ("header", "claims")))
    if header.get("alg") != "none":
        raise InvalidToken(f"the token's header says alg {header.get('alg')!r}: the unsecured validator accepts "
                           f"only alg none")
    return claims


def _json_part(part: str, name: str) -> dict:
    try:
        value = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidToken(f"malformed token: its {name} is not base64url-encoded JSON") from None
    if not isinstance(value, dict):
        raise InvalidToken(f"malformed token: its {name} is not a JSON object")
    return value


def _time_claim(claims: dict, name: str) -> int | None:
    """A NumericDate (seconds since the epoch, possibly fractional) in milliseconds."""
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidToken(f"the token's {name} is not a number of seconds")
    return int(value * 1000)


def _scopes(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(scope, str) for scope in value):
        return frozenset(value)
    return frozenset()


def bearer_token(message: bytes) -> tuple[str, str]:
    """(authorization id, token) of the client's first message; raises AuthenticationFailed when malformed."""
    try:
        match = _CLIENT_FIRST.fullmatch(message.decode("ascii"))
    except UnicodeDecodeError:
        match = None
    if match is None:
        raise AuthenticationFailed("malformed OAUTHBEARER client message: expected n,[a=authzid],"
                                   "\\x01auth=Bearer <token>\\x01\\x01 (RFC 7628)")
    pairs = dict(pair.split("=", 1) for pair in match["pairs"].split(_CONTROL_A) if pair)
    bearer = _BEARER.fullmatch(pairs.get("auth", ""))
    if bearer is None:
        raise AuthenticationFailed("malformed OAUTHBEARER client message: no auth=Bearer <token> pair")
    return match["authzid"] or "", bearer["token"]


class OAuthBearerExchange:
    """One authentication: the client's first message, and after an error answer, its `\\x01`. Other key=value
    pairs (SASL extensions, KIP-342) are accepted and ignored, as Kafka's unsecured validator does."""

    mechanism = MECHANISM
    derives_keys = False

    def __init__(self, validator: UnsecuredValidator, clock: Callable[[], float] = time.time) -> None:
        self._validator = validator
        self._clock = clock
        self._refused: InvalidToken | None = None

    def step(self, message: bytes) -> Step:
        if self._refused is not None:
            if message != _CONTROL_A.encode():
                raise AuthenticationFailed("OAUTHBEARER: expected the client's \\x01 after the error answer")
            raise AuthenticationFailed(f"{self._refused.status}: {self._refused}")
        authzid, token = bearer_token(message)
        try:
            valid = self._validator.validate(token, int(self._clock() * 1000))
        except InvalidToken as exc:
            self._refused = exc
            return Step(exc.error_json(), None)
        if authzid and authzid != valid.principal:
            raise AuthenticationFailed(f"the authorization id {authzid!r} is not the token's principal")
        return Step(b"", valid.principal, valid.expires_at_ms)
