"""TLS listeners with every client: a broker serving PLAINTEXT and SSL side by side, each listener advertising
itself; client certificates (mTLS); a plaintext client on the TLS port and a client that never finishes its
handshake both get a closed connection, never a hang."""
import socket
import ssl
import time

import pytest

from integration import clients
from integration.broker_process import BrokerProcess, free_port
from integration.certificates import CLIENT_SUBJECT, make_certificates
from integration.java_client import java_available, java_consume_all, java_produce
from integration.security_clients import ClientSecurity

TLS_ALERT = 0x15  # the content type of a TLS alert record
API_VERSIONS_V0 = (b"\x00\x00\x00\x0e" b"\x00\x12\x00\x00" b"\x00\x00\x00\x07" b"\x00\x04" b"test")


@pytest.fixture
def certificates(tmp_path):
    return make_certificates(str(tmp_path / "certs"))


def tls_broker(tmp_path, certificates, client_auth="none", **more) -> BrokerProcess:
    plain, secure = free_port(), free_port()
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{secure}",
              "ssl.keystore.location": certificates.broker, "ssl.truststore.location": certificates.ca,
              "ssl.client.auth": client_auth, **more}
    broker = BrokerProcess(str(tmp_path / "data"), port=plain, config=config).start()
    broker.tls_port = secure
    return broker


@pytest.fixture
def broker(tmp_path, certificates):
    broker = tls_broker(tmp_path, certificates)
    yield broker
    broker.stop()


def test_every_client_produces_and_consumes_over_tls_and_is_told_the_tls_address(broker, certificates):
    security = ClientSecurity("SSL", certificates)
    tls = f"127.0.0.1:{broker.tls_port}"
    records = clients.sample_records(20)
    clients.ck_produce(tls, "over-tls", records, **security.confluent())
    clients.kp_produce(tls, "over-tls", records, **security.kafka_python())
    clients.aio_produce(tls, "over-tls", records, **security.aiokafka())
    expected = [r[1] for r in records] * 3
    # The consumers reconnect to the address Metadata names: it must be the TLS listener's, not the plaintext one.
    assert [r.value for r in clients.ck_consume_all(tls, "over-tls", 60, **security.confluent())] == expected
    assert [r.value for r in clients.kp_consume_all(tls, "over-tls", 60, **security.kafka_python())] == expected
    assert [r.value for r in clients.aio_consume_all(tls, "over-tls", 60, **security.aiokafka())] == expected
    # the same records through the plaintext listener
    assert [r.value for r in clients.kp_consume_all(broker.bootstrap, "over-tls", 60)] == expected


@pytest.mark.skipif(not java_available(), reason="no JDK or Java client harness")
def test_java_client_over_tls_with_a_pem_truststore(broker, certificates):
    security = ClientSecurity("SSL", certificates)
    tls = f"127.0.0.1:{broker.tls_port}"
    deliveries = java_produce(tls, "java-tls", 10, value_prefix="v", extra_props=security.java())
    assert [d.error for d in deliveries] == [None] * 10
    consumed = java_consume_all(tls, "java-tls", extra_props=security.java())
    assert [r.value for r in consumed] == [f"v{i}" for i in range(10)]


def test_plaintext_client_on_the_tls_port_gets_a_closed_connection(broker):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as control:
        control.sendall(API_VERSIONS_V0)
        assert len(control.recv(4)) == 4  # the plaintext listener answers
    with socket.create_connection(("127.0.0.1", broker.tls_port), timeout=10) as sock:
        sock.sendall(API_VERSIONS_V0)
        started = time.monotonic()
        answer = _read_until_closed(sock)
        assert answer == b"" or answer[0] == TLS_ALERT  # at most a TLS alert, never a Kafka answer
        assert time.monotonic() - started < 5


def test_librdkafka_plaintext_on_the_tls_port_fails_instead_of_hanging(broker):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.tls_port}"})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)


def test_kafka_python_and_aiokafka_plaintext_on_the_tls_port_fail_instead_of_hanging(broker):
    from aiokafka.errors import KafkaConnectionError
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError
    tls = f"127.0.0.1:{broker.tls_port}"
    with pytest.raises(KafkaTimeoutError):  # the broker closes each attempt; bootstrapping gives up
        KafkaAdminClient(bootstrap_servers=tls, bootstrap_timeout_ms=2000)
    with pytest.raises(KafkaConnectionError):
        clients.aio_produce(tls, "never", [])
    # the control: the same clients, plaintext on the plaintext port, get through
    KafkaAdminClient(bootstrap_servers=broker.bootstrap, bootstrap_timeout_ms=10000).close()
    clients.aio_produce(broker.bootstrap, "plain", clients.sample_records(1))


@pytest.mark.skipif(not java_available(), reason="no JDK or Java client harness")
def test_java_plaintext_on_the_tls_port_fails_instead_of_hanging(broker):
    """The broker closes each plaintext attempt, so the Java producer never learns the topic's metadata: its send
    fails once max.block.ms is up, reported as an error rather than waiting on."""
    deliveries = java_produce(f"127.0.0.1:{broker.tls_port}", "never", 1, extra_props={"max.block.ms": 3000},
                              timeout=60)
    assert [d.error for d in deliveries] == ["TimeoutException"], deliveries


def test_a_tls_handshake_that_never_starts_is_closed_after_the_handshake_timeout(tmp_path, certificates):
    broker = tls_broker(tmp_path, certificates, **{"ssl.handshake.timeout.ms": "1000"})
    try:
        with socket.create_connection(("127.0.0.1", broker.tls_port), timeout=15) as sock:
            started = time.monotonic()
            assert _read_until_closed(sock) == b""  # we send nothing at all
            assert time.monotonic() - started >= 0.9  # closed by the timeout, not at once
    finally:
        broker.stop()


def test_mtls_requires_a_certificate_the_ca_signed(tmp_path, certificates):
    broker = tls_broker(tmp_path, certificates, client_auth="required")
    try:
        tls = f"127.0.0.1:{broker.tls_port}"
        with_cert = ClientSecurity("SSL", certificates, client_certificate=True)
        clients.ck_produce(tls, "mtls", clients.sample_records(3), **with_cert.confluent())
        assert len(clients.kp_consume_all(tls, "mtls", 3, **with_cert.kafka_python())) == 3
        assert _handshake(broker.tls_port, certificates.ca) is not None  # no certificate: refused
        assert _handshake(broker.tls_port, certificates.ca,
                          (certificates.stranger_cert, certificates.stranger_key)) is not None  # another CA's
        assert _handshake(broker.tls_port, certificates.ca, (certificates.client_cert, certificates.client_key)) is None
    finally:
        broker.stop()


def _handshake(port: int, ca: str, certificate: tuple[str, str] | None = None) -> Exception | None:
    """None when the broker took the handshake and answers a request over it; else what went wrong."""
    context = ssl.create_default_context(cafile=ca)
    if certificate:
        context.load_cert_chain(*certificate)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(API_VERSIONS_V0)  # TLS 1.3 reports a refused certificate on the first read
                if len(sock.recv(4)) != 4:
                    return ConnectionError("closed")
                return None
    except (ssl.SSLError, OSError) as exc:
        return exc


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_the_certificate_subject_is_the_principal_acls_name(tmp_path, certificates):
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                       ResourcePatternType, ResourceType)
    broker = tls_broker(tmp_path, certificates, client_auth="required",
                        **{"authorizer.enabled": "true", "super.users": "User:ANONYMOUS"})  # the plaintext admin
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        grant = AclBinding(ResourceType.TOPIC, "alices", ResourcePatternType.LITERAL, f"User:{CLIENT_SUBJECT}", "*",
                           AclOperation.WRITE, AclPermissionType.ALLOW)
        for future in admin.create_acls([grant]).values():
            future.result(10)
        for future in admin.create_topics([NewTopic("alices", 1), NewTopic("not-alices", 1)]).values():
            future.result(10)  # alice may write, not create
        security = ClientSecurity("SSL", certificates, client_certificate=True)
        reports = []
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{broker.tls_port}", **security.confluent(),
                             "message.timeout.ms": 5000, "retries": 0})
        for topic in ("alices", "not-alices"):
            producer.produce(topic, b"x", on_delivery=lambda err, msg: reports.append((msg.topic(), err)))
        producer.flush(10)
        outcome = {topic: err.code() if err else None for topic, err in reports}
        assert outcome == {"alices": None, "not-alices": KafkaError.TOPIC_AUTHORIZATION_FAILED}
    finally:
        broker.stop()
