"""SaslHandshake (key 17) and SaslAuthenticate (key 36). Version notes: after a v0 handshake the client sends its
tokens as bare frames (the connection handles those); v1 wraps them in SaslAuthenticate. SaslAuthenticate v1+
carries session_lifetime_ms (KIP-368), v2 is flexible. A failed authentication is answered, then the connection
closes; on a listener without SASL both answer ILLEGAL_SASL_STATE, as Kafka does."""
import logging

from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from kop.config import BrokerConfig
from kop.handlers.context import RequestContext
from kop.security.oauthbearer import MECHANISM as OAUTHBEARER
from kop.security.oauthbearer import OAuthBearerExchange, UnsecuredValidator
from kop.security.sasl import AuthenticationFailed, SaslExchange, start_exchange
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


async def handshake(ctx: RequestContext, request: SaslHandshakeRequest) -> SaslHandshakeResponse:
    cls = SaslHandshakeResponse[ctx.version]
    session = ctx.session
    enabled = ctx.config.sasl_enabled_mechanisms.split(",")
    reauthenticating = session.authenticated
    if not session.listener.sasl or session.exchange is not None or (reauthenticating and ctx.version == 0):
        session.close_after_response = session.listener.sasl
        return cls(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=enabled)
    if request.mechanism not in enabled or (reauthenticating and request.mechanism != session.mechanism):
        log.warning("SASL mechanism %r refused (enabled: %s)", request.mechanism, ",".join(enabled),
                    extra=ctx.log_fields)
        session.close_after_response = True
        return cls(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled)
    session.begin(_exchange(ctx, request.mechanism), raw_tokens=ctx.version == 0)
    return cls(error_code=ErrorCode.NONE, mechanisms=enabled)


def _exchange(ctx: RequestContext, mechanism: str) -> SaslExchange:
    if mechanism == OAUTHBEARER:  # the configuration allows it only with the validator turned on
        return OAuthBearerExchange(unsecured_validator(ctx.config))
    return start_exchange(mechanism, ctx.users)


def unsecured_validator(config: BrokerConfig) -> UnsecuredValidator:
    return UnsecuredValidator(config.sasl_oauthbearer_unsecured_validator_principal_claim_name,
                              config.sasl_oauthbearer_unsecured_validator_scope_claim_name,
                              frozenset(config.sasl_oauthbearer_unsecured_validator_required_scope.split()),
                              config.sasl_oauthbearer_unsecured_validator_allowable_clock_skew_ms)


async def authenticate(ctx: RequestContext, request: SaslAuthenticateRequest) -> SaslAuthenticateResponse:
    cls = SaslAuthenticateResponse[ctx.version]
    session = ctx.session
    if not session.listener.sasl or session.exchange is None or session.raw_tokens:
        session.close_after_response = session.listener.sasl
        return cls(error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message="SaslAuthenticate without a SaslHandshake "
                   "v1 first", auth_bytes=b"", session_lifetime_ms=0)
    try:
        step = await session.advance(bytes(request.auth_bytes), ctx.config.connections_max_reauth_ms)
    except AuthenticationFailed as exc:
        log.warning("SASL authentication failed: %s", exc, extra=ctx.log_fields)
        return cls(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=f"Authentication failed: {exc}",
                   auth_bytes=b"", session_lifetime_ms=0)
    done = step.user is not None
    return cls(error_code=ErrorCode.NONE, error_message=None, auth_bytes=step.challenge,
               session_lifetime_ms=session.lifetime_ms if done else 0)


ROUTES = [(SaslHandshakeRequest.API_KEY, 0, 1, handshake), (SaslAuthenticateRequest.API_KEY, 0, 2, authenticate)]
