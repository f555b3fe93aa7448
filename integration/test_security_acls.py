"""ACLs as Kafka has them, driven by real admin clients and enforced on real producers and consumers: prefixed and
literal patterns, ALLOW and DENY, super users, changes at run time, durability across a restart, Metadata hiding
what a principal may not describe, and SECURITY_DISABLED without the authorizer."""
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)

from integration import clients
from integration.test_security_sasl import ADMIN, ADMIN_PASSWORD, PASSWORD, USER, SaslBroker

BOB, BOB_PASSWORD = "bob", "bob-password"
MECHANISM = "SCRAM-SHA-256"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = SaslBroker(str(tmp_path_factory.mktemp("acls")), **{"authorizer.enabled": "true"}).start()
    for user, password in ((ADMIN, ADMIN_PASSWORD), (USER, PASSWORD), (BOB, BOB_PASSWORD)):
        broker.set_password(user, password)
    admin = admin_client(broker)
    for future in admin.create_topics([NewTopic(t, 1) for t in ("orders-a", "orders-blocked", "secret")]).values():
        future.result(10)
    yield broker
    broker.process.stop()


def config(broker, user=USER, password=PASSWORD) -> dict:
    return {"bootstrap.servers": broker.bootstrap("SASL_PLAINTEXT"),
            **broker.security("SASL_PLAINTEXT", MECHANISM, user, password).confluent()}


def admin_client(broker) -> AdminClient:
    return AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))


def acl(resource_type, name, pattern, operation, permission=AclPermissionType.ALLOW, principal=f"User:{USER}"):
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def create(broker, *bindings) -> None:
    admin = admin_client(broker)  # held until the answers are in: a dropped client cancels them
    for future in admin.create_acls(list(bindings)).values():
        future.result(10)


def delete(broker, *filters) -> list:
    admin = admin_client(broker)
    return [b for future in admin.delete_acls(list(filters)).values() for b in future.result(10)]


def produce(broker, topic, user=USER, password=PASSWORD) -> KafkaError | None:
    """The delivery error of one record (None: stored)."""
    from confluent_kafka import Producer
    reports = []
    producer = Producer({**config(broker, user, password), "message.timeout.ms": 5000, "retries": 0})
    producer.produce(topic, b"x", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(10)
    return reports[0]


WRITE_ORDERS = acl(ResourceType.TOPIC, "orders-", ResourcePatternType.PREFIXED, AclOperation.WRITE)


def test_prefixed_allow_and_literal_deny_decide_who_writes_where(broker):
    create(broker, WRITE_ORDERS, acl(ResourceType.TOPIC, "orders-blocked", ResourcePatternType.LITERAL,
                                     AclOperation.WRITE, AclPermissionType.DENY))
    assert produce(broker, "orders-a") is None
    assert produce(broker, "secret").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # no ACL names it for alice
    assert produce(broker, "orders-blocked").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # DENY wins
    assert produce(broker, "orders-a", BOB, BOB_PASSWORD).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce(broker, "secret", ADMIN, ADMIN_PASSWORD) is None  # a super user


def test_metadata_hides_topics_a_principal_may_not_describe(broker):
    create(broker, WRITE_ORDERS)  # WRITE implies DESCRIBE
    assert set(AdminClient(config(broker)).list_topics(timeout=10).topics) == {"orders-a", "orders-blocked"}
    assert set(AdminClient(config(broker, BOB, BOB_PASSWORD)).list_topics(timeout=10).topics) == set()
    assert {"orders-a", "orders-blocked", "secret"} <= set(admin_client(broker).list_topics(timeout=10).topics)


# consumer: KIP-848's ConsumerGroupHeartbeat; it finds "readers" an empty classic group after the classic run, and
# takes it over (offline upgrade)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consuming_needs_read_on_the_topic_and_the_group(broker, protocol):
    from confluent_kafka import Consumer
    create(broker, WRITE_ORDERS, acl(ResourceType.TOPIC, "orders-a", ResourcePatternType.LITERAL, AclOperation.READ),
           acl(ResourceType.GROUP, "readers", ResourcePatternType.LITERAL, AclOperation.READ))
    assert produce(broker, "orders-a") is None

    def first_poll(group: str):
        consumer = Consumer({**config(broker), "group.id": group, "group.protocol": protocol,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["orders-a"])
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None:
                    return message
        finally:
            consumer.close()
    assert first_poll("readers").error() is None
    assert first_poll("others").error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_acls_change_at_run_time_and_survive_a_restart(broker):
    create(broker, WRITE_ORDERS)
    assert produce(broker, "orders-a") is None
    broker.process.stop()
    broker.process.start()
    assert produce(broker, "orders-a") is None
    removed = delete(broker, AclBindingFilter(ResourceType.TOPIC, "orders-", ResourcePatternType.PREFIXED,
                                              f"User:{USER}", None, AclOperation.WRITE, AclPermissionType.ANY))
    assert removed == [WRITE_ORDERS]
    assert produce(broker, "orders-a").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_describe_acls_filters_by_pattern(broker):
    create(broker, WRITE_ORDERS, acl(ResourceType.GROUP, "readers", ResourcePatternType.LITERAL, AclOperation.READ))
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    admin = admin_client(broker)
    assert WRITE_ORDERS in admin.describe_acls(every).result(10)
    matching = AclBindingFilter(ResourceType.TOPIC, "orders-zzz", ResourcePatternType.MATCH, None, None,
                                AclOperation.ANY, AclPermissionType.ANY)
    assert WRITE_ORDERS in admin.describe_acls(matching).result(10)
    # kafka-python's admin client reads the same ACLs
    from kafka.admin import (ACLFilter, ACLOperation, ACLPermissionType, KafkaAdminClient, ResourcePatternFilter)
    from kafka.admin import ACLResourcePatternType as KpPattern
    from kafka.admin import ResourceType as KpType
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap("SASL_PLAINTEXT"),
                          **broker.security("SASL_PLAINTEXT", MECHANISM, ADMIN, ADMIN_PASSWORD).kafka_python())
    try:
        acls, error = kp.describe_acls(ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                                                 permission_type=ACLPermissionType.ANY,
                                                 resource_pattern=ResourcePatternFilter(KpType.GROUP, None,
                                                                                        KpPattern.ANY)))
        assert [(a.principal, a.resource_pattern.resource_name) for a in acls] == [(f"User:{USER}", "readers")]
    finally:
        kp.close()


def test_only_principals_with_alter_on_the_cluster_change_acls(broker):
    as_alice = AdminClient(config(broker))
    with pytest.raises(KafkaException) as refused:
        for future in as_alice.create_acls([WRITE_ORDERS]).values():
            future.result(10)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_acl_requests_without_the_authorizer_answer_security_disabled(tmp_path):
    plain = SaslBroker(str(tmp_path)).start()
    try:
        plain.set_password(ADMIN, ADMIN_PASSWORD)
        admin = admin_client(plain)
        with pytest.raises(KafkaException) as refused:
            for future in admin.create_acls([WRITE_ORDERS]).values():
                future.result(10)
        assert refused.value.args[0].code() == KafkaError.SECURITY_DISABLED
        assert clients.kp_produce(plain.bootstrap("PLAINTEXT"), "open", [(None, b"x", [], 0)])  # anyone writes
    finally:
        plain.process.stop()


def test_cluster_admin_apis_need_their_acls(broker):
    """DescribeLogDirs needs DESCRIBE on the cluster: kafka-python shows a refusal as an empty list, so ask raw."""
    from kafka.protocol.admin import DescribeLogDirsRequest, DescribeLogDirsResponse

    from integration.test_security_sasl import call, sasl_socket, scram_login

    def describe_log_dirs(user, password):
        with sasl_socket(broker) as sock:
            assert scram_login(sock, MECHANISM, user, password).error_code == 0
            return call(sock, DescribeLogDirsRequest[4](topics=None), DescribeLogDirsResponse, 4, 7)
    refused = describe_log_dirs(USER, PASSWORD)
    assert refused.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED and refused.results == []
    answered = describe_log_dirs(ADMIN, ADMIN_PASSWORD)  # the control: a super user is answered
    assert answered.error_code == 0 and len(answered.results) == 1


def test_kafka_4_admin_apis_authorize_as_kafka_does(broker):
    """DescribeQuorum and ListConfigResources need DESCRIBE (DESCRIBE_CONFIGS) on the cluster; DescribeTopicPartitions
    leaves out of a listing the topics a principal may not describe and refuses them by name."""
    from kafka.protocol.admin import (DescribeQuorumRequest, DescribeQuorumResponse, DescribeTopicPartitionsRequest,
                                      DescribeTopicPartitionsResponse, ListConfigResourcesRequest,
                                      ListConfigResourcesResponse)

    from integration.test_security_sasl import call, sasl_socket, scram_login

    def ask(user, password):
        with sasl_socket(broker) as sock:
            assert scram_login(sock, MECHANISM, user, password).error_code == 0
            quorum = call(sock, DescribeQuorumRequest[2](topics=[]), DescribeQuorumResponse, 2, 7)
            configs = call(sock, ListConfigResourcesRequest[1](resource_types=[2]), ListConfigResourcesResponse, 1, 8)
            listing = call(sock, DescribeTopicPartitionsRequest[0](topics=[], response_partition_limit=100,
                                                                    cursor=None),
                           DescribeTopicPartitionsResponse, 0, 9)
            named = call(sock, DescribeTopicPartitionsRequest[0](
                topics=[DescribeTopicPartitionsRequest.TopicRequest(name="secret")], response_partition_limit=100,
                cursor=None), DescribeTopicPartitionsResponse, 0, 10)
            return quorum, configs, listing, named
    create(broker, acl(ResourceType.TOPIC, "orders-a", ResourcePatternType.LITERAL, AclOperation.DESCRIBE,
                       principal=f"User:{BOB}"))
    quorum, configs, listing, named = ask(BOB, BOB_PASSWORD)
    assert quorum.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert configs.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED and configs.config_resources == []
    assert [t.name for t in listing.topics] == ["orders-a"]
    assert [(t.name, t.error_code) for t in named.topics] == [("secret", KafkaError.TOPIC_AUTHORIZATION_FAILED)]
    quorum, configs, listing, named = ask(ADMIN, ADMIN_PASSWORD)  # the control: a super user is answered in full
    assert quorum.error_code == 0 and configs.error_code == 0
    assert {"orders-a", "orders-blocked", "secret"} <= {t.name for t in listing.topics}
    assert [(t.name, t.error_code) for t in named.topics] == [("secret", 0)]
