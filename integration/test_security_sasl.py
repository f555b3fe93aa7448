"""SASL PLAIN and SCRAM-SHA-256/512 over SASL_PLAINTEXT and SASL_SSL with every client; what a wrong password, an
unknown mechanism, a request before authentication and an expired session get (the right error, then the connection
closed); users managed over the admin API and AlterUserScramCredentials, durable, never stored in the clear."""
import base64
import json
import os
import socket
import time
import urllib.request

import pytest
import scramp
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from integration import clients
from integration.broker_process import BrokerProcess, free_port
from integration.certificates import make_certificates
from integration.java_client import java_available, java_consume_all, java_group_consume, java_produce
from integration.security_clients import ClientSecurity
from integration.test_bad_input import frame_of, is_closed, read_frame, recv_exact
from protocol.errors import ErrorCode

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PROTOCOLS = ["SASL_PLAINTEXT", "SASL_SSL"]
USER, PASSWORD = "alice", "correct horse battery staple"
ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"


class SaslBroker:
    def __init__(self, directory: str, **more: str) -> None:
        self.certificates = make_certificates(os.path.join(directory, "certs"))
        self.ports = {"PLAINTEXT": free_port(), "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port()}
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.ports.items())
        config = {"listeners": listeners, "ssl.keystore.location": self.certificates.broker,
                  "super.users": f"User:{ADMIN}", **more}
        self.process = BrokerProcess(os.path.join(directory, "data"), port=self.ports["PLAINTEXT"], admin_port=0,
                                     config=config)

    def start(self) -> "SaslBroker":
        self.process.start()
        return self

    def bootstrap(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"

    def security(self, protocol: str, mechanism: str, user: str = USER, password: str = PASSWORD,
                 token: str = "") -> ClientSecurity:
        return ClientSecurity(protocol, self.certificates, mechanism=mechanism, user=user, password=password,
                              token=token)

    def set_password(self, user: str, password: str) -> dict:
        request = urllib.request.Request(f"{self.process.admin_url}/admin/v2/users/{user}", method="POST",
                                         data=json.dumps({"password": password}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


@pytest.fixture(scope="module")
def sasl(tmp_path_factory):
    broker = SaslBroker(str(tmp_path_factory.mktemp("sasl"))).start()
    broker.set_password(USER, PASSWORD)
    broker.set_password(ADMIN, ADMIN_PASSWORD)
    yield broker
    broker.process.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_python_clients_produce_and_consume_with_each_mechanism(sasl, protocol, mechanism):
    security = sasl.security(protocol, mechanism)
    topic = f"sasl-{protocol}-{mechanism}".lower()
    records = clients.sample_records(10)
    clients.ck_produce(sasl.bootstrap(protocol), topic, records, **security.confluent(), **{"enable.idempotence": True})
    clients.kp_produce(sasl.bootstrap(protocol), topic, records, **security.kafka_python(), enable_idempotence=True)
    clients.aio_produce(sasl.bootstrap(protocol), topic, records, **security.aiokafka(), enable_idempotence=True)
    expected = [r[1] for r in records] * 3
    bootstrap = sasl.bootstrap(protocol)
    assert [r.value for r in clients.ck_consume_all(bootstrap, topic, 30, **security.confluent())] == expected
    assert [r.value for r in clients.kp_consume_all(bootstrap, topic, 30, **security.kafka_python())] == expected
    assert [r.value for r in clients.aio_consume_all(bootstrap, topic, 30, **security.aiokafka())] == expected


@pytest.mark.skipif(not java_available(), reason="no JDK or Java client harness")
@pytest.mark.parametrize("protocol, mechanism", [pytest.param("SASL_SSL", "SCRAM-SHA-512", marks=pytest.mark.slow),
                                                 ("SASL_PLAINTEXT", "PLAIN"),
                                                 pytest.param("SASL_SSL", "SCRAM-SHA-256", marks=pytest.mark.slow)])
def test_java_client_produces_idempotently_and_consumes_in_a_group(sasl, protocol, mechanism):
    security = sasl.security(protocol, mechanism).java()
    topic = f"java-{protocol}-{mechanism}".lower()
    deliveries = java_produce(sasl.bootstrap(protocol), topic, 20, value_prefix="v", extra_props=security)
    assert [d.error for d in deliveries] == [None] * 20
    assert [r.value for r in java_consume_all(sasl.bootstrap(protocol), topic, extra_props=security)] == \
        [f"v{i}" for i in range(20)]
    group = java_group_consume(sasl.bootstrap(protocol), topic, f"group-{topic}", max_records=20, idle_ms=2000,
                               extra_props=security)
    assert sorted(r.value for r in group.records) == sorted(f"v{i}" for i in range(20))


def test_consumer_groups_over_sasl_ssl(sasl):
    from confluent_kafka import Consumer
    security = sasl.security("SASL_SSL", "SCRAM-SHA-256")
    clients.ck_produce(sasl.bootstrap("SASL_SSL"), "sasl-group", clients.sample_records(10), **security.confluent())
    consumer = Consumer({"bootstrap.servers": sasl.bootstrap("SASL_SSL"), "group.id": "sasl-group",
                         "auto.offset.reset": "earliest", **security.confluent()})
    consumer.subscribe(["sasl-group"])
    seen, deadline = [], time.monotonic() + 30
    while len(seen) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.offset())
    consumer.commit(asynchronous=False)
    committed = consumer.committed(consumer.assignment(), timeout=10)
    consumer.close()
    assert sorted(seen) == list(range(10))
    assert [tp.offset for tp in committed] == [10]


def assert_every_client_refused(bootstrap: str, security: ClientSecurity, reason: str) -> None:
    """librdkafka reports the broker's reason as an authentication error; kafka-python gives up bootstrapping;
    aiokafka fails to connect. None hangs."""
    from aiokafka.errors import KafkaConnectionError
    from confluent_kafka import KafkaError, Producer
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, **security.confluent(), "error_cb": errors.append})
    producer.poll(5)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert reason in errors[0].str()
    with pytest.raises(KafkaTimeoutError):
        KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=2000, **security.kafka_python())
    with pytest.raises(KafkaConnectionError):
        clients.aio_produce(bootstrap, "never", [], **security.aiokafka())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_gets_an_authentication_error_from_every_client(sasl, mechanism, caplog):
    assert_every_client_refused(sasl.bootstrap("SASL_SSL"), sasl.security("SASL_SSL", mechanism, password="wrong"),
                                "Invalid username or password")
    # kafka-python and aiokafka log the broker's error
    failures = [r for r in caplog.records if "SaslAuthenticationFailed" in r.getMessage()]
    assert {r.name.split(".")[0] for r in failures} == {"kafka", "aiokafka"}, [r.getMessage() for r in failures]


@pytest.mark.skipif(not java_available(), reason="no JDK or Java client harness")
@pytest.mark.parametrize("mechanism, password, error, reason", [  # 2-3 s each (a JVM), up to 10 s under load
    ("SCRAM-SHA-512", "wrong", "SaslAuthenticationException", "Invalid username or password"),
    pytest.param("PLAIN", "wrong", "SaslAuthenticationException", "Invalid username or password",
                 marks=pytest.mark.slow),
    # a mechanism the JDK's SASL provider has and kop does not: refused at the handshake, with the enabled list
    ("CRAM-MD5", PASSWORD, "UnsupportedSaslMechanismException", "SCRAM-SHA-512"),
])
def test_the_java_client_is_refused_with_the_brokers_reason(sasl, mechanism, password, error, reason):
    """Java's producer fails every send with the authentication error (fatal: it does not retry) well before its
    deadline, instead of waiting for metadata that never comes."""
    security = sasl.security("SASL_SSL", mechanism, password=password).java()
    deliveries = java_produce(sasl.bootstrap("SASL_SSL"), "never", 2, idempotence=False, extra_props=security,
                              timeout=60)
    assert [d.error for d in deliveries] == [error] * 2, deliveries
    assert all(reason in (d.error_message or "") for d in deliveries), deliveries


# ---- the protocol as a raw client sees it

def sasl_socket(sasl, protocol="SASL_PLAINTEXT") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", sasl.ports[protocol]), timeout=10)
    sock.settimeout(10)
    return sock


def call(sock, request, response_class, version, correlation_id=1):
    sock.sendall(frame_of(request, correlation_id))
    return response_class[version].decode(read_frame(sock), version=version, header=True)


def scram_login(sock, mechanism, user=USER, password=PASSWORD, authenticate_version=2):
    handshake = call(sock, SaslHandshakeRequest[1](mechanism=mechanism), SaslHandshakeResponse, 1)
    assert handshake.error_code == ErrorCode.NONE
    client = scramp.ScramClient([mechanism], user, password)
    first = call(sock, SaslAuthenticateRequest[authenticate_version](auth_bytes=client.get_client_first().encode()),
                 SaslAuthenticateResponse, authenticate_version, 2)
    if first.error_code:
        return first
    client.set_server_first(bytes(first.auth_bytes).decode())
    final = call(sock, SaslAuthenticateRequest[authenticate_version](auth_bytes=client.get_client_final().encode()),
                 SaslAuthenticateResponse, authenticate_version, 3)
    if final.error_code == ErrorCode.NONE:
        client.set_server_final(bytes(final.auth_bytes).decode())  # the broker proves it knows the credential
    return final


def metadata_answers(sock) -> bool:
    try:
        answer = call(sock, MetadataRequest[1](topics=[]), MetadataResponse, 1, 9)
    except (ConnectionError, OSError):
        return False
    return answer.controller_id == 1


def test_a_request_before_authentication_closes_the_connection(sasl):
    with sasl_socket(sasl) as sock:
        sock.sendall(frame_of(MetadataRequest[1](topics=[])))
        assert is_closed(sock)
    with sasl_socket(sasl) as control:
        assert scram_login(control, "SCRAM-SHA-256").error_code == ErrorCode.NONE
        assert metadata_answers(control)


def test_a_wrong_scram_proof_is_answered_then_the_connection_closed(sasl):
    with sasl_socket(sasl) as sock:
        answer = scram_login(sock, "SCRAM-SHA-512", password="wrong")
        assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Invalid username or password" in answer.error_message
        assert is_closed(sock)
    with sasl_socket(sasl) as sock:  # an unknown user gets the same answer: no way to tell users exist
        assert scram_login(sock, "SCRAM-SHA-512", user="nobody").error_message == answer.error_message


def test_an_unknown_mechanism_gets_the_enabled_list_then_the_connection_closed(sasl):
    with sasl_socket(sasl) as sock:
        answer = call(sock, SaslHandshakeRequest[1](mechanism="GSSAPI"), SaslHandshakeResponse, 1)
        assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert answer.mechanisms == MECHANISMS
        assert is_closed(sock)


def test_sasl_handshake_v0_then_bare_tokens(sasl):
    with sasl_socket(sasl) as sock:
        assert call(sock, SaslHandshakeRequest[0](mechanism="PLAIN"), SaslHandshakeResponse, 0).error_code == 0
        token = f"\0{USER}\0{PASSWORD}".encode()
        sock.sendall(len(token).to_bytes(4, "big") + token)
        assert recv_exact(sock, 4) == b"\0\0\0\0"  # an empty bare answer: authenticated
        assert metadata_answers(sock)
    with sasl_socket(sasl) as sock:
        call(sock, SaslHandshakeRequest[0](mechanism="PLAIN"), SaslHandshakeResponse, 0)
        token = f"\0{USER}\0wrong".encode()
        sock.sendall(len(token).to_bytes(4, "big") + token)
        assert is_closed(sock)  # a bare token has no error field: closing is the answer


def test_plaintext_listener_refuses_sasl_with_illegal_sasl_state(sasl):
    with sasl_socket(sasl, "PLAINTEXT") as sock:
        answer = call(sock, SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse, 1)
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert metadata_answers(sock)


def test_unauthenticated_requests_are_bounded_in_size_and_count(sasl):
    with sasl_socket(sasl) as sock:
        sock.sendall((600_000).to_bytes(4, "big"))  # above sasl.server.max.receive.size
        assert is_closed(sock)
    with sasl_socket(sasl) as sock:
        answered = 0
        for correlation_id in range(40):
            try:
                sock.sendall(frame_of(ApiVersionsRequest[0](), correlation_id))
                read_frame(sock)
                answered += 1
            except (ConnectionError, OSError):
                break
        assert answered == 16  # MAX_UNAUTHENTICATED_REQUESTS, then closed


@pytest.mark.file_storage  # users.json; on PostgreSQL the users are records in the database
def test_user_credentials_are_durable_and_never_stored_in_the_clear(sasl):
    stored = open(os.path.join(sasl.process.data_dir, "users.json"), "rb").read()
    for secret in (PASSWORD, ADMIN_PASSWORD):
        assert secret.encode() not in stored
        assert base64.b64encode(secret.encode()) not in stored
    assert USER.encode() in stored  # the control: this is the file that holds the users
    assert oct(os.stat(os.path.join(sasl.process.data_dir, "users.json")).st_mode & 0o777) == "0o600"


def test_alter_user_scram_credentials_needs_a_super_user_and_survives_a_restart(tmp_path):
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)
    broker = SaslBroker(str(tmp_path)).start()
    try:
        broker.set_password(ADMIN, ADMIN_PASSWORD)
        broker.set_password(USER, PASSWORD)
        upsert = UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                              b"bob-secret")
        as_user = AdminClient({"bootstrap.servers": broker.bootstrap("SASL_SSL"),
                               **broker.security("SASL_SSL", "SCRAM-SHA-256").confluent()})
        with pytest.raises(Exception, match="CLUSTER_AUTHORIZATION_FAILED|super user"):
            as_user.alter_user_scram_credentials([upsert])["bob"].result(10)
        as_admin = AdminClient({"bootstrap.servers": broker.bootstrap("SASL_SSL"),
                                **broker.security("SASL_SSL", "SCRAM-SHA-512", ADMIN, ADMIN_PASSWORD).confluent()})
        as_admin.alter_user_scram_credentials([upsert])["bob"].result(10)
        described = as_admin.describe_user_scram_credentials(["bob"])["bob"].result(10)
        assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == \
            [(ScramMechanism.SCRAM_SHA_256, 4096)]
        broker.process.stop()
        broker.process.start()
        with sasl_socket(broker) as sock:
            assert scram_login(sock, "SCRAM-SHA-256", "bob", "bob-secret").error_code == ErrorCode.NONE
        with sasl_socket(broker) as sock:  # only the mechanism that was set
            assert scram_login(sock, "SCRAM-SHA-512", "bob", "bob-secret").error_code == \
                ErrorCode.SASL_AUTHENTICATION_FAILED
    finally:
        broker.process.stop()


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_an_expired_session_closes_the_connection_and_clients_reauthenticate(tmp_path):
    broker = SaslBroker(str(tmp_path), **{"connections.max.reauth.ms": "2000"}).start()
    try:
        broker.set_password(USER, PASSWORD)
        with sasl_socket(broker) as sock:
            answer = scram_login(sock, "SCRAM-SHA-256")
            assert answer.session_lifetime_ms == 2000
            assert metadata_answers(sock)  # the control: served within the session
            time.sleep(2.5)
            assert not metadata_answers(sock)
        with sasl_socket(broker) as sock:  # re-authenticating in time keeps the connection
            scram_login(sock, "SCRAM-SHA-256")
            time.sleep(1.2)
            assert scram_login(sock, "SCRAM-SHA-256").error_code == ErrorCode.NONE
            time.sleep(1.2)
            assert metadata_answers(sock)  # 2.4 s after the first login
        # librdkafka re-authenticates on its own (KIP-368): a producer keeps going across several lifetimes
        from confluent_kafka import Producer
        security = broker.security("SASL_SSL", "SCRAM-SHA-512")
        errors, delivered = [], []
        producer = Producer({"bootstrap.servers": broker.bootstrap("SASL_SSL"), **security.confluent(),
                             "error_cb": errors.append})
        for i in range(12):
            producer.produce("reauth", f"v{i}".encode(), on_delivery=lambda e, m: delivered.append(e))
            producer.flush(10)
            time.sleep(0.5)
        assert delivered == [None] * 12 and not errors
    finally:
        broker.process.stop()


def expiry_closures(broker: SaslBroker, client_id: str) -> int:
    """How many of this client's connections the broker closed because their SASL session had expired."""
    with open(broker.process.log_path, encoding="utf-8", errors="replace") as log:
        return sum(1 for line in log
                   if "expired (connections.max.reauth.ms)" in line and f"client_id={client_id} " in line)


@pytest.mark.slow  # each client runs across two and a half session lifetimes of 2 s
def test_an_expired_session_never_hangs_a_client(tmp_path, caplog):
    """kafka-python and Java re-authenticate before their session ends (KIP-368); aiokafka does not, so the broker
    closes its connection at its first request past the lifetime and the producer reconnects, signs in again and
    retries. Each works across several lifetimes, every wait bounded. (Whether a re-authenticating client ever
    lands past its lifetime depends on timing, so that is not asserted: it would reconnect as aiokafka does.)"""
    import asyncio
    import logging

    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer
    broker = SaslBroker(str(tmp_path), **{"connections.max.reauth.ms": "2000"}).start()
    try:
        broker.set_password(USER, PASSWORD)
        security = broker.security("SASL_PLAINTEXT", "SCRAM-SHA-256")
        bootstrap = broker.bootstrap("SASL_PLAINTEXT")
        caplog.set_level(logging.DEBUG, logger="kafka.net.connection")
        producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="kp-reauth", **security.kafka_python())
        try:
            for i in range(8):
                producer.send("reauth", f"kp{i}".encode()).get(timeout=15)
                time.sleep(0.6)
        finally:
            producer.close(timeout=10)
        assert any("Beginning SASL re-authentication" in r.getMessage() for r in caplog.records)

        async def aiokafka_sends() -> None:
            aio = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="aio-reauth", request_timeout_ms=10000,
                                   **security.aiokafka())
            await aio.start()
            try:
                for i in range(8):
                    await asyncio.wait_for(aio.send_and_wait("reauth", f"aio{i}".encode()), 15)
                    await asyncio.sleep(0.6)
            finally:
                await aio.stop()
        asyncio.run(aiokafka_sends())
        assert expiry_closures(broker, "aio-reauth") >= 1  # the control: the lifetime is enforced
        assert any("closed" in r.getMessage() for r in caplog.records if r.name.startswith("aiokafka"))

        if java_available():  # consumes the 16 records, then polls on for 5 s (fetches, heartbeats) before leaving
            group = java_group_consume(bootstrap, "reauth", "java-reauth", max_records=17, idle_ms=5000,
                                       extra_props={"client.id": "java-reauth", **security.java()})
            assert group.stop_reason == "idle"
            assert sorted(r.value for r in group.records) == sorted(
                [f"kp{i}" for i in range(8)] + [f"aio{i}" for i in range(8)])
            assert group.committed == {0: 16}
    finally:
        broker.process.stop()


def test_kafka_python_and_aiokafka_consume_in_groups_over_sasl_ssl(sasl):
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from kafka import KafkaConsumer
    security = sasl.security("SASL_SSL", "SCRAM-SHA-512")
    bootstrap = sasl.bootstrap("SASL_SSL")
    clients.kp_produce(bootstrap, "sasl-groups", clients.sample_records(10), **security.kafka_python())
    consumer = KafkaConsumer("sasl-groups", bootstrap_servers=bootstrap, group_id="kp-group",
                             auto_offset_reset="earliest", consumer_timeout_ms=15000, **security.kafka_python())
    seen = []
    for message in consumer:
        seen.append(message.offset)
        if len(seen) == 10:
            break
    consumer.commit()
    consumer.close()
    assert seen == list(range(10))

    async def aio_group() -> list[int]:
        consumer = AIOKafkaConsumer("sasl-groups", bootstrap_servers=bootstrap, group_id="aio-group",
                                    auto_offset_reset="earliest", **security.aiokafka())
        await consumer.start()
        try:
            offsets = []
            async with asyncio.timeout(30):
                async for message in consumer:
                    offsets.append(message.offset)
                    if len(offsets) == 10:
                        await consumer.commit()
                        return offsets
        finally:
            await consumer.stop()
    assert asyncio.run(aio_group()) == list(range(10))


def test_connections_from_one_address_are_capped(tmp_path):
    broker = SaslBroker(str(tmp_path), **{"max.connections.per.ip": "3"})
    broker.process.start()

    def served_connection() -> socket.socket | None:
        """A connection whose ApiVersions is answered, or None when the broker closes it."""
        sock = sasl_socket(broker)
        try:
            sock.sendall(frame_of(ApiVersionsRequest[0]()))
            read_frame(sock)
            return sock
        except (ConnectionError, OSError):
            sock.close()
            return None

    def eventually_served() -> socket.socket:  # the broker may not have seen an earlier close yet
        deadline = time.monotonic() + 10
        while (sock := served_connection()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock is not None
        return sock
    try:
        held = [eventually_served() for _ in range(3)]
        assert served_connection() is None  # a fourth from the same address is closed
        held.pop().close()
        held.append(eventually_served())  # the control: below the cap again, served
        for sock in held:
            sock.close()
    finally:
        broker.process.stop()
