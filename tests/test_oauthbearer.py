"""The unsecured JWT validator's rules on times, scopes and claim names, and the OAUTHBEARER exchange's two rounds,
at a fixed clock (the integration tests drive the same code with real clients)."""
import pytest

from integration.security_clients import unsecured_jwt
from kop.security.oauthbearer import InvalidToken, OAuthBearerExchange, UnsecuredValidator, bearer_token
from kop.security.sasl import AuthenticationFailed

NOW = 1_700_000_000  # seconds


def token(**claims) -> str:
    return unsecured_jwt({"sub": "alice", "iat": NOW - 10, "exp": NOW + 60} | claims)


@pytest.mark.parametrize("claims, reason", [
    ({"exp": NOW - 0.001}, "expired"),
    ({"iat": NOW + 5}, "issued in the future"),
    ({"iat": NOW + 60}, "issued in the future"),
    ({"exp": "tomorrow"}, "not a number"),
    ({"exp": True}, "not a number"),
    ({"sub": ""}, "no principal"),
    ({"sub": 42}, "no principal"),
])
def test_times_and_principal_are_checked(claims, reason):
    with pytest.raises(InvalidToken, match=reason):
        UnsecuredValidator().validate(token(**claims), NOW * 1000)


def test_exp_not_after_iat_is_refused():
    with pytest.raises(InvalidToken, match="expires before it was issued"):
        UnsecuredValidator(clock_skew_ms=60_000).validate(token(iat=NOW + 30, exp=NOW + 30), NOW * 1000)


def test_clock_skew_allows_a_token_just_expired_or_just_issued():
    skewed = UnsecuredValidator(clock_skew_ms=2000)
    assert skewed.validate(token(exp=NOW - 1), NOW * 1000).expires_at_ms == (NOW - 1) * 1000
    assert skewed.validate(token(iat=NOW + 1), NOW * 1000).principal == "alice"
    with pytest.raises(InvalidToken, match="expired"):  # the control: beyond the skew
        skewed.validate(token(exp=NOW - 3), NOW * 1000)


def test_claim_names_and_required_scopes_are_configurable():
    validator = UnsecuredValidator(principal_claim="client_id", scope_claim="scp",
                                   required_scopes=frozenset({"read", "write"}))
    valid = validator.validate(token(client_id="svc", scp="write read extra"), NOW * 1000)
    assert valid.principal == "svc"
    assert validator.validate(token(client_id="svc", scp=["read", "write"]), NOW * 1000).principal == "svc"
    with pytest.raises(InvalidToken, match="lacks the required scope write") as refused:
        validator.validate(token(client_id="svc", scope=["read", "write"], scp=["read"]), NOW * 1000)
    assert refused.value.error_json() == b'{"status":"insufficient_scope","scope":"read write"}'


def test_the_exchange_answers_an_error_then_fails_on_the_clients_acknowledgement():
    exchange = OAuthBearerExchange(UnsecuredValidator(), clock=lambda: NOW)
    answer = exchange.step(f"n,,\x01auth=Bearer {token(exp=NOW - 5)}\x01\x01".encode())
    assert (answer.challenge, answer.user) == (b'{"status":"invalid_token"}', None)
    with pytest.raises(AuthenticationFailed, match="invalid_token: the token expired 5.000 s ago"):
        exchange.step(b"\x01")


def test_a_valid_token_completes_in_one_round_with_its_expiry():
    exchange = OAuthBearerExchange(UnsecuredValidator(), clock=lambda: NOW)
    done = exchange.step(f"n,a=alice,\x01host=kafka\x01auth=bearer  {token()}\x01port=9093\x01\x01".encode())
    assert (done.challenge, done.user, done.expires_at_ms) == (b"", "alice", (NOW + 60) * 1000)


@pytest.mark.parametrize("message", [b"n,,\x01auth=Bearer a b\x01\x01", b"n,,auth=Bearer abc\x01\x01",
                                     b"n,,\x01auth=Basic abc\x01\x01", b"p=x,,\x01auth=Bearer abc\x01\x01", b""])
def test_messages_outside_rfc_7628_are_refused(message):
    with pytest.raises(AuthenticationFailed, match="malformed OAUTHBEARER client message"):
        bearer_token(message)
