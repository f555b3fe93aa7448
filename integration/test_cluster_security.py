"""Security in a cluster of brokers on one PostgreSQL database: users, ACLs and quotas set through one broker hold on
every broker (kop/shared_book.py), and the brokers' requests to each other go over a SASL_SSL listener as the
brokers' own user (kop/cluster/peers.py). Real processes, a real PostgreSQL, the `kop admin` command line,
confluent-kafka (librdkafka) and raw SASL exchanges against each broker."""
import os
import socket
import subprocess
import sys

import pytest
from kafka.protocol.admin.client_quotas import (AlterClientQuotasRequest, AlterClientQuotasResponse,
                                                DescribeClientQuotasRequest, DescribeClientQuotasResponse)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from integration.broker_process import REPO, free_port
from integration.certificates import make_certificates
from integration.pg_cluster import PgCluster
from integration.security_clients import ClientSecurity
from integration.test_security_sasl import call, scram_login
from integration.waiting import wait_for
from protocol.errors import ErrorCode

NODES = [1, 2, 3]
ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
ALICE, ALICE_PASSWORD = "alice", "alice-secret"
BOB, BOB_PASSWORD = "bob", "bob-secret"
MECHANISM = "SCRAM-SHA-512"


@pytest.fixture
def cluster(tmp_path, postgres_url):
    made = PgCluster(str(tmp_path), postgres_url)
    yield made
    made.stop()


def set_user(cluster: PgCluster, node: int, user: str, password: str) -> None:
    """`kop admin users set` against one broker's admin API."""
    done = subprocess.run([sys.executable, "-m", "kop.cli", "admin", "--admin-url", cluster.brokers[node].admin_url,
                           "users", "set", user, "--password-stdin"], input=password.encode(), cwd=REPO,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()


def sasl_port_of(cluster: PgCluster, node: int) -> int:
    return int(cluster.brokers[node].config["listeners"].rpartition(":")[2])


def signs_in(port: int, user: str, password: str) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        return scram_login(sock, MECHANISM, user, password).error_code == ErrorCode.NONE


def topic_errors(port: int, user: str, password: str, topics: list[str]) -> dict[str, int]:
    """What Metadata answers `user`, signed in on the broker at `port`, for each topic."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        assert scram_login(sock, MECHANISM, user, password).error_code == ErrorCode.NONE
        answer = call(sock, MetadataRequest[1](topics=topics), MetadataResponse, 1, 9)
    return {t.name: t.error_code for t in answer.topics}


def alter_quota(port: int, user: str, rate: float) -> int:
    """AlterClientQuotas of a user's produce rate, as the admin user on the broker at `port`; its error code."""
    Entry = AlterClientQuotasRequest.EntryData
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        assert scram_login(sock, MECHANISM, ADMIN, ADMIN_PASSWORD).error_code == ErrorCode.NONE
        answer = call(sock, AlterClientQuotasRequest[0](entries=[Entry(
            entity=[Entry.EntityData(entity_type="user", entity_name=user)],
            ops=[Entry.OpData(key="producer_byte_rate", value=rate, remove=False)])], validate_only=False),
            AlterClientQuotasResponse, 0, 9)
    return answer.entries[0].error_code


def described_quotas(port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        assert scram_login(sock, MECHANISM, ADMIN, ADMIN_PASSWORD).error_code == ErrorCode.NONE
        answer = call(sock, DescribeClientQuotasRequest[0](components=[], strict=False),
                      DescribeClientQuotasResponse, 0, 9)
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
            for entry in answer.entries}


@pytest.mark.slow
def test_a_user_acls_and_quotas_set_through_one_broker_hold_on_every_broker(cluster):
    """Clients use a SASL_PLAINTEXT listener, with the authorizer on; the brokers reach each other on PLAINTEXT.
    Users come from `kop admin users set` on broker 1 and AlterUserScramCredentials on broker 2, ACLs from
    CreateAcls on broker 1, a quota from AlterClientQuotas on broker 3: every broker signs the users in, allows and
    refuses what the ACLs say, and lists the quota."""
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       NewTopic, ResourcePatternType, ResourceType, ScramCredentialInfo,
                                       ScramMechanism, UserScramCredentialUpsertion)
    for node in NODES:
        cluster.add(node, {"listeners": f"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:{free_port()}",
                           "authorizer.enabled": "true", "super.users": f"User:{ADMIN}",
                           "sasl.enabled.mechanisms": MECHANISM})
    cluster.wait_for_members(set(NODES))
    ports = {node: sasl_port_of(cluster, node) for node in NODES}
    set_user(cluster, 1, ADMIN, ADMIN_PASSWORD)
    set_user(cluster, 1, ALICE, ALICE_PASSWORD)
    for node in NODES:  # each broker reads the users at its next heartbeat
        wait_for(lambda: signs_in(ports[node], ALICE, ALICE_PASSWORD), f"broker {node} to sign alice in")
        assert not signs_in(ports[node], ALICE, "wrong")  # the control: the password is checked
    security = ClientSecurity("SASL_PLAINTEXT", mechanism=MECHANISM, user=ADMIN, password=ADMIN_PASSWORD)
    admin = {node: AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[node]}", **security.confluent()})
             for node in NODES}
    for future in admin[1].create_topics([NewTopic("open", 3), NewTopic("closed", 3)]).values():
        future.result(30)
    read_open = AclBinding(ResourceType.TOPIC, "open", ResourcePatternType.LITERAL, f"User:{ALICE}", "*",
                           AclOperation.READ, AclPermissionType.ALLOW)
    admin[1].create_acls([read_open])[read_open].result(30)
    admin[2].alter_user_scram_credentials([UserScramCredentialUpsertion(
        BOB, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), BOB_PASSWORD.encode())])[BOB].result(30)
    allowed = {"open": ErrorCode.NONE, "closed": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    for node in NODES:
        wait_for(lambda: topic_errors(ports[node], ALICE, ALICE_PASSWORD, ["open", "closed"]) == allowed,
                 f"broker {node} to allow alice to read `open` only")
        wait_for(lambda: signs_in(ports[node], BOB, BOB_PASSWORD), f"broker {node} to sign bob in")
        assert topic_errors(ports[node], BOB, BOB_PASSWORD, ["open"]) == {"open": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert alter_quota(ports[3], ALICE, 1024.0) == ErrorCode.NONE  # librdkafka has no quota API: a raw request
    described = {(("user", ALICE),): {"producer_byte_rate": 1024.0}}
    for node in NODES:
        wait_for(lambda: described_quotas(ports[node]) == described, f"broker {node} to list alice's quota")
    # Deleting the ACL through broker 3 refuses alice everywhere again
    deleted = AclBindingFilter(ResourceType.TOPIC, "open", ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
                               AclPermissionType.ANY)
    assert len(admin[3].delete_acls([deleted])[deleted].result(30)) == 1
    for node in NODES:
        wait_for(lambda: topic_errors(ports[node], ALICE, ALICE_PASSWORD, ["open"]) ==
                 {"open": ErrorCode.TOPIC_AUTHORIZATION_FAILED}, f"broker {node} to refuse alice again")
    assert admin[2].describe_acls(deleted).result(30) == []
    for node in NODES:
        assert not os.path.exists(os.path.join(cluster.brokers[node].data_dir, "users.json"))


@pytest.mark.slow
def test_a_cluster_whose_only_listener_is_sasl_ssl_runs_a_transaction_over_every_brokers_partitions(cluster):
    """The one listener is SASL_SSL with the authorizer on: the brokers sign in to each other as `broker` (a super
    user; Kafka's sasl.jaas.config gives its password) over TLS checked against the test CA, to write the markers
    of a transaction coordinated by one broker on the partitions the others own, and to verify its batches there.
    The transactional producer is alice, allowed only what a transaction needs."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                       ResourcePatternType, ResourceType)
    from integration.test_cluster_transactions import PARTITIONS, finish, group_coordinator, named, txn_coordinator
    from integration.txn_clients import READ_UNCOMMITTED, ck_read_to_end, values
    certificates = make_certificates(os.path.join(cluster.root, "certs"))
    broker_password = "broker-secret"
    for node in NODES:
        port = free_port()
        cluster.add(node, {
            "listeners": f"SASL_SSL://127.0.0.1:{port}", "ssl.keystore.location": certificates.broker,
            "ssl.truststore.location": certificates.ca, "security.inter.broker.protocol": "SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM, "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" '
                                f'password="{broker_password}";',
            "authorizer.enabled": "true", "super.users": f"User:broker;User:{ADMIN}"}, port=port)
    for user, password in ((ADMIN, ADMIN_PASSWORD), ("broker", broker_password), (ALICE, ALICE_PASSWORD)):
        set_user(cluster, 1, user, password)
    admin_security = ClientSecurity("SASL_SSL", certificates, mechanism=MECHANISM, user=ADMIN, password=ADMIN_PASSWORD)
    alice = ClientSecurity("SASL_SSL", certificates, mechanism=MECHANISM, user=ALICE, password=ALICE_PASSWORD)
    bootstrap = cluster.bootstrap

    def everyone_listed() -> bool:
        for node in NODES:
            listed = AdminClient({"bootstrap.servers": cluster.brokers[node].bootstrap, **admin_security.confluent()})
            if set(listed.list_topics(timeout=10).brokers) != set(NODES):
                return False
        return True
    wait_for(everyone_listed, "the three brokers to sign the admin in and list each other")
    admin = AdminClient({"bootstrap.servers": bootstrap, **admin_security.confluent()})
    topic = "secured"
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(30)
    coordinator = 2
    transactional_id = named("secured", coordinator, txn_coordinator)
    group = named("secured-group", 3, group_coordinator)
    grants = [AclBinding(kind, name, ResourcePatternType.LITERAL, f"User:{ALICE}", "*", operation,
                         AclPermissionType.ALLOW)
              for kind, name, operation in ((ResourceType.TOPIC, topic, AclOperation.WRITE),
                                            (ResourceType.TOPIC, topic, AclOperation.READ),
                                            (ResourceType.TRANSACTIONAL_ID, transactional_id, AclOperation.WRITE),
                                            (ResourceType.GROUP, group, AclOperation.READ))]
    for future in admin.create_acls(grants).values():
        future.result(30)

    def alice_sees_the_topic_on_every_broker() -> bool:  # each reads the ACLs at its next heartbeat
        for node in NODES:
            seen = AdminClient({"bootstrap.servers": cluster.brokers[node].bootstrap, **alice.confluent()})
            if seen.list_topics(topic, timeout=10).topics[topic].error is not None:
                return False
        return True
    wait_for(alice_sees_the_topic_on_every_broker, "every broker to know alice's grants")

    def leaders() -> dict[int, int]:
        found = admin.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: found[p].leader for p in found}
    wait_for(lambda: set(leaders().values()) == set(NODES), "the partitions spread over the three brokers")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 60_000, **alice.confluent()})
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **alice.confluent()})
    try:
        producer.init_transactions(60)
        committed = [f"c{i}".encode() for i in range(3 * PARTITIONS)]
        aborted = [f"a{i}".encode() for i in range(PARTITIONS)]
        for batch, commit in ((committed, True), (aborted, False)):
            producer.begin_transaction()
            for i, value in enumerate(batch):
                producer.produce(topic, value, partition=i % PARTITIONS)
            assert producer.flush(60) == 0
            if commit:
                producer.send_offsets_to_transaction([TopicPartition(topic, 0, 3)], member.consumer_group_metadata(),
                                                     60)
            finish(producer, commit)
    finally:
        member.close()
    read = {"security": admin_security.confluent()}
    seen = values(ck_read_to_end(bootstrap, topic, range(PARTITIONS), **read))
    assert sorted(seen) == sorted(committed), sorted(set(seen) ^ set(committed))[:5]  # every broker's markers
    stored = values(ck_read_to_end(bootstrap, topic, range(PARTITIONS), isolation=READ_UNCOMMITTED, **read))
    assert set(aborted) <= set(stored)  # the control: the aborted records were stored, and are not read
    offsets = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **alice.confluent()})
    try:
        assert offsets.committed([TopicPartition(topic, 0)], 30)[0].offset == 3  # through the group's coordinator
    finally:
        offsets.close()
    links = cluster.brokers[coordinator].log_tail(2000)
    for other in (1, 3):
        assert f"inter-broker link to broker-{other} at 127.0.0.1:{cluster.port(other)} connected" in links
