"""Replication to a secured remote: west serves only SASL and TLS listeners to anyone but the anonymous (refused
by its ACLs), and lets the user `repl` replicate (CLUSTER_ACTION on its cluster). east's definition of west carries
the link's security settings, set with `kop admin clusters create|update`; a wrong password is shown in the topic's
stats and nothing arrives (the control), then each protocol and mechanism carries every record, exactly once."""
import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from integration import clients
from integration.broker_process import REPO, BrokerProcess
from integration.geo import replicate, topic_stats, wait_for
from integration.idem_raw import RawKafka
from integration.test_admin import admin_json
from integration.test_geo_replication import produce
from integration.test_security_acls import create as create_acls
from integration.test_security_sasl import ADMIN, ADMIN_PASSWORD, SaslBroker
from kop.admin.client import AdminClient, cluster_resource
from protocol.errors import ErrorCode

REPL, REPL_PASSWORD = "repl", "replicator-secret"


@pytest.fixture
def east_and_secured_west(tmp_path):
    west = SaslBroker(str(tmp_path / "west"), **{"authorizer.enabled": "true", "clusterName": "west"}).start()
    east = BrokerProcess(str(tmp_path / "east" / "data"), admin_port=0, options=("--cluster-name", "east")).start()
    try:
        for user, password in ((ADMIN, ADMIN_PASSWORD), (REPL, REPL_PASSWORD)):
            west.set_password(user, password)
        create_acls(west, AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                                     f"User:{REPL}", "*", AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW))
        AdminClient(west.process.admin_url).put(cluster_resource("east"), {"brokerServiceUrl": east.bootstrap})
        replicate(east, ["east", "west"])
        with RawKafka(east.port) as kafka:
            assert kafka.create_topic("orders", 2) == ErrorCode.NONE
        yield east, west
    finally:
        east.stop()
        west.process.stop()


def define_west(east: BrokerProcess, west: SaslBroker, verb: str, protocol: str, mechanism: str,
                password: str) -> None:
    """`kop admin clusters create|update west` with the link's settings, the password on standard input."""
    args = ["--broker-url", west.bootstrap(protocol), "--security-protocol", protocol,
            "--sasl-mechanism", mechanism, "--sasl-username", REPL, "--sasl-password-stdin"]
    if protocol == "SASL_SSL":
        args += ["--ssl-ca-file", west.certificates.ca]
    done = subprocess.run([sys.executable, "-m", "kop.cli", "admin", "--admin-url", east.admin_url, "clusters", verb,
                           "west", *args], cwd=REPO, input=password + "\n", capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def in_west(west: SaslBroker, count: int) -> list[bytes]:
    """The records of `orders` in west, read by its super user over SASL."""
    security = west.security("SASL_PLAINTEXT", "SCRAM-SHA-256", ADMIN, ADMIN_PASSWORD)
    records = clients.ck_consume_all(west.bootstrap("SASL_PLAINTEXT"), "orders", count, partitions=(0, 1),
                                     timeout=30, **security.confluent())
    return sorted(r.value for r in records)


def replicator(east: BrokerProcess) -> dict:
    return topic_stats(east, "orders")["replication"]["west"]


@pytest.mark.slow  # 15 s: two brokers, a restart, three definitions of the link
def test_a_replicator_authenticates_to_a_remote_with_sasl_tls_and_acls(east_and_secured_west, storage_engine):
    east, west = east_and_secured_west
    define_west(east, west, "create", "SASL_PLAINTEXT", "SCRAM-SHA-256", "not the password")
    produce(east.bootstrap, "orders", "first", 20, 2)
    wait_for(lambda: "authentication as repl" in (replicator(east)["lastError"] or ""), 20,
             "the authentication failure in the stats")
    assert replicator(east)["entriesReplicated"] == 0  # control: the remote lets no one in without credentials

    define_west(east, west, "update", "SASL_SSL", "SCRAM-SHA-512", REPL_PASSWORD)
    shown = admin_json(east, "clusters", "get", "west")
    assert shown == {"name": "west", "brokerServiceUrl": west.bootstrap("SASL_SSL"), "serviceUrl": "",
                     "securityProtocol": "SASL_SSL", "saslMechanism": "SCRAM-SHA-512", "saslUsername": REPL,
                     "sslCaFile": west.certificates.ca}  # never the password
    if storage_engine == "file":  # which is kept there (PostgreSQL: in the database, with the other shared records)
        assert os.stat(os.path.join(east.data_dir, "clusters")).st_mode & 0o777 == 0o600
    wait_for(lambda: replicator(east)["entriesReplicated"] > 0, 20, "replication over SASL_SSL")
    assert in_west(west, 20) == sorted(f"first:{i}".encode() for i in range(20))

    define_west(east, west, "update", "SASL_PLAINTEXT", "PLAIN", REPL_PASSWORD)
    produce(east.bootstrap, "orders", "second", 20, 2)
    expected = sorted([f"first:{i}".encode() for i in range(20)] + [f"second:{i}".encode() for i in range(20)])
    wait_for(lambda: replicator(east)["replicationBacklog"] == 0 and replicator(east)["lastError"] is None, 20,
             "replication over SASL_PLAINTEXT with PLAIN")
    assert in_west(west, 40) == expected
    east.restart()  # the definition, password included, survives
    produce(east.bootstrap, "orders", "third", 10, 2)
    assert in_west(west, 50) == sorted(expected + [f"third:{i}".encode() for i in range(10)])
