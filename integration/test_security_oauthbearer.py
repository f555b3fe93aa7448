"""SASL OAUTHBEARER with the unsecured JWT validator, driven by real clients (librdkafka making its own unsecured JWT,
kafka-python and aiokafka with token providers, the Java client's unsecured login) over SASL_PLAINTEXT and SASL_SSL;
what an expired, principal-less, malformed or under-scoped token gets (RFC 7628's error answer, then the failure and
the connection closed); ACLs on the token's principal; the session ending with the token (KIP-368) and
re-authentication with a new token on the same connection."""
import time

import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from integration import clients
from integration.java_client import java_available, java_consume_all, java_produce
from integration.security_clients import token_for, unsecured_jwt
from integration.test_bad_input import is_closed
from integration.test_metrics import sample, scrape
from integration.test_security_sasl import (PROTOCOLS, USER, SaslBroker, assert_every_client_refused, call,
                                            metadata_answers, sasl_socket)
from protocol.errors import ErrorCode

OAUTH = "OAUTHBEARER"
VALIDATOR = {"sasl.enabled.mechanisms": f"{OAUTH},SCRAM-SHA-256",
             "sasl.oauthbearer.unsecured.validator.enabled": "true"}
SCOPE = "kafka"


@pytest.fixture(scope="module")
def oauth(tmp_path_factory):
    broker = SaslBroker(str(tmp_path_factory.mktemp("oauth")), **VALIDATOR).start()
    yield broker
    broker.process.stop()


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """Tokens need the scope `kafka`; the authorizer is on, `admin` is a super user."""
    broker = SaslBroker(str(tmp_path_factory.mktemp("oauth-strict")), **VALIDATOR,
                        **{"unsecuredValidatorRequiredScope": SCOPE, "authorizer.enabled": "true"}).start()
    yield broker
    broker.process.stop()


def oauth_login(sock, token: str, authzid: str = "", correlation_id: int = 1) -> SaslAuthenticateResponse:
    """SaslHandshake v1 and the client's first message; the answer of SaslAuthenticate v2."""
    handshake = call(sock, SaslHandshakeRequest[1](mechanism=OAUTH), SaslHandshakeResponse, 1, correlation_id)
    assert handshake.error_code == ErrorCode.NONE, handshake
    message = f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01\x01".encode()
    return authenticate(sock, message, correlation_id + 1)


def authenticate(sock, message: bytes, correlation_id: int = 2) -> SaslAuthenticateResponse:
    return call(sock, SaslAuthenticateRequest[2](auth_bytes=message), SaslAuthenticateResponse, 2, correlation_id)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_clients_produce_and_consume_with_oauthbearer(oauth, protocol):
    security = oauth.security(protocol, OAUTH)
    bootstrap = oauth.bootstrap(protocol)
    topic = f"oauth-{protocol}".lower()
    records = clients.sample_records(10)
    clients.ck_produce(bootstrap, topic, records, **security.confluent(), **{"enable.idempotence": True})
    clients.kp_produce(bootstrap, topic, records, **security.kafka_python(), enable_idempotence=True)
    clients.aio_produce(bootstrap, topic, records, **security.aiokafka(), enable_idempotence=True)
    expected = [r[1] for r in records] * 3
    assert [r.value for r in clients.ck_consume_all(bootstrap, topic, 30, **security.confluent())] == expected
    assert [r.value for r in clients.kp_consume_all(bootstrap, topic, 30, **security.kafka_python())] == expected
    assert [r.value for r in clients.aio_consume_all(bootstrap, topic, 30, **security.aiokafka())] == expected


@pytest.mark.skipif(not java_available(), reason="no JDK or Java client harness")
def test_java_client_with_its_unsecured_login(oauth):
    security = oauth.security("SASL_SSL", OAUTH).java()
    deliveries = java_produce(oauth.bootstrap("SASL_SSL"), "oauth-java", 10, value_prefix="v", extra_props=security)
    assert [d.error for d in deliveries] == [None] * 10
    assert [r.value for r in java_consume_all(oauth.bootstrap("SASL_SSL"), "oauth-java", extra_props=security)] == \
        [f"v{i}" for i in range(10)]


BAD_TOKENS = {  # token -> (RFC 7628 status, what the failure says)
    "expired": (token_for(USER, lifetime_s=-60), "invalid_token", "expired"),
    "without-sub": (unsecured_jwt({"iat": time.time(), "exp": time.time() + 86400}), "invalid_token", "no principal"),
    "without-exp": (unsecured_jwt({"sub": USER}), "invalid_token", "no expiration time"),
    "not-a-jwt": ("definitely-not-a-jwt", "invalid_token", "malformed token"),
    "garbage-claims": ("eyJhbGciOiJub25lIn0.bm90IGpzb24.", "invalid_token", "not base64url-encoded JSON"),
    "signed": (unsecured_jwt({"sub": USER, "exp": time.time() + 86400}, {"alg": "HS256"}, "c2lnbmF0dXJl"),
               "invalid_token", "signed token"),
    "alg-not-none": (unsecured_jwt({"sub": USER, "exp": time.time() + 86400}, {"alg": "HS256"}), "invalid_token",
                     "alg 'HS256'"),
}


@pytest.mark.parametrize("case", BAD_TOKENS)
def test_an_invalid_token_gets_the_error_answer_then_the_failure_and_the_close(oauth, case):
    token, status, reason = BAD_TOKENS[case]
    with sasl_socket(oauth) as sock:
        answer = oauth_login(sock, token)
        assert answer.error_code == ErrorCode.NONE  # RFC 7628 §3.2.2: the error is a challenge ...
        assert bytes(answer.auth_bytes) == f'{{"status":"{status}"}}'.encode()
        failure = authenticate(sock, b"\x01", 3)  # ... the client acknowledges it, and only then it fails
        assert failure.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert reason in failure.error_message
        assert is_closed(sock)
    with sasl_socket(oauth) as control:  # the same exchange with a valid token authenticates
        assert oauth_login(control, token_for(USER)).error_code == ErrorCode.NONE
        assert metadata_answers(control)


def test_a_missing_scope_is_insufficient_scope(strict):
    with sasl_socket(strict) as sock:
        answer = oauth_login(sock, token_for(USER, scope=["other"]))
        assert bytes(answer.auth_bytes) == b'{"status":"insufficient_scope","scope":"kafka"}'
        failure = authenticate(sock, b"\x01", 3)
        assert failure.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "lacks the required scope kafka" in failure.error_message
        assert is_closed(sock)
    for scope in (["other", SCOPE], f"other {SCOPE}"):  # a JSON array, or a string of space-separated scopes
        with sasl_socket(strict) as sock:
            assert oauth_login(sock, token_for(USER, scope=scope)).error_code == ErrorCode.NONE


@pytest.mark.parametrize("message", [b"n,,\x01auth=Bearer\x01\x01", b"n,,\x01host=x\x01\x01", b"\x01",
                                     b"y,,\x01auth=Bearer a.b.\x01\x01", b"n,,\x01auth=Bearer a.b.\x01", b"\xff"])
def test_a_malformed_client_message_fails_at_once(oauth, message):
    with sasl_socket(oauth) as sock:
        assert call(sock, SaslHandshakeRequest[1](mechanism=OAUTH), SaslHandshakeResponse, 1).error_code == 0
        failure = authenticate(sock, message)
        assert failure.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "malformed OAUTHBEARER client message" in failure.error_message
        assert is_closed(sock)


def test_extensions_are_accepted_and_an_authorization_id_must_be_the_principal(oauth):
    with sasl_socket(oauth) as sock:
        message = f"n,a={USER},\x01auth=Bearer {token_for(USER)}\x01traceId=abc\x01\x01".encode()
        assert authenticate_after_handshake(sock, message).error_code == ErrorCode.NONE
        assert metadata_answers(sock)
    with sasl_socket(oauth) as sock:
        failure = oauth_login(sock, token_for(USER), authzid="mallory")
        assert failure.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert is_closed(sock)


def authenticate_after_handshake(sock, message: bytes) -> SaslAuthenticateResponse:
    assert call(sock, SaslHandshakeRequest[1](mechanism=OAUTH), SaslHandshakeResponse, 1).error_code == 0
    return authenticate(sock, message)


def test_real_clients_with_a_bad_token_fail_without_hanging(oauth, caplog):
    expired = oauth.security("SASL_SSL", OAUTH, token=BAD_TOKENS["expired"][0])
    assert_every_client_refused(oauth.bootstrap("SASL_SSL"), expired, "the token expired")
    # kafka-python acknowledges the error answer and logs the failure; aiokafka does not send the \x01: it goes on
    # as if authenticated, and its next request, before authentication, closes the connection
    failures = [r for r in caplog.records if "SaslAuthenticationFailed" in r.getMessage()]
    assert {r.name.split(".")[0] for r in failures} == {"kafka"}, [r.getMessage() for r in failures]


def test_librdkafka_required_scope_and_acls_on_the_token_principal(strict):
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                       ResourcePatternType, ResourceType)

    def config(user: str, scope: str = SCOPE) -> dict:
        security = strict.security("SASL_PLAINTEXT", OAUTH, user).confluent()
        security["sasl.oauthbearer.config"] += f" scope={scope}"
        return {"bootstrap.servers": strict.bootstrap("SASL_PLAINTEXT"), **security}

    def produce(user: str, scope: str = SCOPE) -> KafkaError | None:
        reports, errors = [], []
        producer = Producer({**config(user, scope), "message.timeout.ms": 5000, "error_cb": errors.append})
        producer.produce("oauth-acl", b"x", on_delivery=lambda err, msg: reports.append(err))
        deadline = time.monotonic() + 10
        while not (reports or errors) and time.monotonic() < deadline:
            producer.poll(0.2)
        return errors[0] if errors else reports[0]  # an authentication failure comes as an error, not a report

    admin = AdminClient(config("admin"))  # the super user, by its token's sub
    admin.create_topics([NewTopic("oauth-acl", 1)])["oauth-acl"].result(10)
    assert produce(USER, scope="other").code() == KafkaError._AUTHENTICATION  # librdkafka's scope: a JSON array
    assert produce(USER).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # authenticated, not authorized
    binding = AclBinding(ResourceType.TOPIC, "oauth-acl", ResourcePatternType.LITERAL, f"User:{USER}", "*",
                         AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([binding]).values():
        future.result(10)
    assert produce(USER) is None
    assert produce("bob").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # the ACL names alice only


def test_the_session_ends_with_the_token_and_a_new_token_reauthenticates(oauth):
    with sasl_socket(oauth) as sock:
        answer = oauth_login(sock, token_for(USER, lifetime_s=1.5))
        assert 0 < answer.session_lifetime_ms <= 1500
        assert metadata_answers(sock)  # the control: served within the session
        time.sleep(1.7)
        assert not metadata_answers(sock)  # the token expired: so did the session
    with sasl_socket(oauth) as sock:
        oauth_login(sock, token_for(USER, lifetime_s=1.5))
        time.sleep(0.8)
        answer = oauth_login(sock, token_for(USER, lifetime_s=600), correlation_id=3)  # KIP-368, same connection
        assert answer.error_code == ErrorCode.NONE and answer.session_lifetime_ms > 590_000
        time.sleep(1)
        assert metadata_answers(sock)  # 1.8 s after the first login
        refused = oauth_login(sock, token_for("mallory"), correlation_id=5)  # as someone else: refused
        assert refused.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert is_closed(sock)


def test_connections_max_reauth_ms_caps_a_longer_token(tmp_path):
    broker = SaslBroker(str(tmp_path), **VALIDATOR, **{"connections.max.reauth.ms": "1000"}).start()
    try:
        with sasl_socket(broker) as sock:
            assert oauth_login(sock, token_for(USER, lifetime_s=600)).session_lifetime_ms == 1000
            assert oauth_login(sock, token_for(USER, lifetime_s=0.5), correlation_id=3).session_lifetime_ms <= 500
    finally:
        broker.process.stop()


@pytest.mark.slow  # about 13 s: two token lifetimes
def test_librdkafka_refreshes_its_token_and_reauthenticates(oauth):
    # librdkafka refreshes a token after 80% of its lifetime, checking once a second and from the application's
    # poll, and re-authenticates after 90% of the session: a 6 s token is refreshed in time
    security = oauth.security("SASL_SSL", OAUTH).confluent()
    security["sasl.oauthbearer.config"] += " lifeSeconds=6"
    errors, delivered = [], []
    authentications = sample(scrape(oauth.process), "kop_requests_total", api="SaslAuthenticate")
    producer = Producer({"bootstrap.servers": oauth.bootstrap("SASL_SSL"), **security, "error_cb": errors.append})
    for i in range(26):  # one record each half second, for 13 s: over two tokens' lifetimes
        producer.produce("oauth-reauth", f"v{i}".encode(), on_delivery=lambda e, m: delivered.append(e))
        next_record = time.monotonic() + 0.5
        while time.monotonic() < next_record:  # poll returns early when it serves a callback
            producer.poll(0.1)
    producer.flush(10)
    assert delivered == [None] * 26 and not errors
    # two connections (bootstrap, broker) authenticated, then went on by re-authenticating with new tokens
    assert sample(scrape(oauth.process), "kop_requests_total", api="SaslAuthenticate") - authentications >= 4
