"""ACLs enforced on each API a client can call, one case per API: a principal no ACL names is refused with the error
Kafka gives (TOPIC_, GROUP_, CLUSTER_ or TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and a super user's same call, the
control, is answered. Driven by confluent-kafka's admin client and producer (librdkafka) and, where a client does
not say what came back, by raw requests. Topics named by id tell nothing of themselves to who may not describe them."""
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, AlterConfigOpType,
                                   ConfigEntry, ConfigResource, NewPartitions, NewTopic, ResourcePatternType,
                                   ResourceType, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)
from kafka.protocol.admin import (DeleteTopicsRequest, DeleteTopicsResponse, DescribeClientQuotasRequest,
                                  DescribeClientQuotasResponse, DescribeProducersRequest, DescribeProducersResponse,
                                  DescribeTransactionsRequest, DescribeTransactionsResponse,
                                  DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse)
from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse

from integration.test_security_acls import BOB, BOB_PASSWORD, MECHANISM, config
from integration.test_security_sasl import ADMIN, ADMIN_PASSWORD, PASSWORD, USER, SaslBroker, call, sasl_socket, \
    scram_login

TOPIC, GROUP, TRANSACTION = "guarded", "guarded-group", "guarded-txn"
HIDDEN = "hidden"  # no ACL names it: bob may not even describe it
TOPIC_DENIED = KafkaError.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = KafkaError.GROUP_AUTHORIZATION_FAILED
CLUSTER_DENIED = KafkaError.CLUSTER_AUTHORIZATION_FAILED
TXN_DENIED = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = SaslBroker(str(tmp_path_factory.mktemp("acl-apis")), **{"authorizer.enabled": "true"}).start()
    for user, password in ((ADMIN, ADMIN_PASSWORD), (USER, PASSWORD), (BOB, BOB_PASSWORD)):
        broker.set_password(user, password)
    admin = AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))
    for future in admin.create_topics([NewTopic(TOPIC, 2), NewTopic(HIDDEN, 1)]).values():
        future.result(10)
    # bob may see the topic (librdkafka's admin client looks a topic up before it asks), and do nothing else
    describe = AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, f"User:{BOB}", "*",
                          AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    result(admin.create_acls([describe]))
    reports = []
    producer = Producer(config(broker, ADMIN, ADMIN_PASSWORD))
    producer.produce(TOPIC, b"stored", partition=0, on_delivery=lambda err, msg: reports.append(err))
    producer.flush(10)
    assert reports == [None]
    offsets = ConsumerGroupTopicPartitions(GROUP, [TopicPartition(TOPIC, 0, 1)])
    admin.alter_consumer_group_offsets([offsets])[GROUP].result(10)
    yield broker
    broker.process.stop()


def result(futures, timeout=15):
    """Every future's result; the first failure's Kafka error code raised as it is."""
    values = futures.values() if isinstance(futures, dict) else [futures]
    return [future.result(timeout) for future in values]


def error_code(call_it) -> int | None:
    try:
        call_it()
    except KafkaException as exc:
        return exc.args[0].code()
    return None


topic_config = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
broker_config = ConfigResource(ConfigResource.Type.BROKER, "1")

# (what is asked, how, the refusal a principal without ACLs gets)
CASES = [
    ("CreateTopics", lambda a: result(a.create_topics([NewTopic("new-topic", 1)], validate_only=True)), TOPIC_DENIED),
    ("CreatePartitions", lambda a: result(a.create_partitions([NewPartitions(TOPIC, 3)], validate_only=True)),
     TOPIC_DENIED),
    ("DeleteTopics", lambda a: result(a.delete_topics(["no-such-topic"])), TOPIC_DENIED),
    ("DescribeConfigs topic", lambda a: result(a.describe_configs([topic_config])), TOPIC_DENIED),
    ("DescribeConfigs broker", lambda a: result(a.describe_configs([broker_config])), CLUSTER_DENIED),
    ("AlterConfigs", lambda a: result(a.alter_configs([ConfigResource(
        ConfigResource.Type.TOPIC, TOPIC, set_config={"retention.ms": "86400000"})])), TOPIC_DENIED),
    ("IncrementalAlterConfigs", lambda a: result(a.incremental_alter_configs([ConfigResource(
        ConfigResource.Type.TOPIC, TOPIC, incremental_configs=[ConfigEntry(
        "retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])])), TOPIC_DENIED),
    ("DeleteRecords", lambda a: result(a.delete_records([TopicPartition(TOPIC, 1, 0)])), TOPIC_DENIED),
    ("OffsetFetch", lambda a: result(a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        GROUP, [TopicPartition(TOPIC, 0)])])), GROUP_DENIED),
    ("OffsetCommit", lambda a: result(a.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        GROUP, [TopicPartition(TOPIC, 0, 1)])])), GROUP_DENIED),
    ("DescribeGroups", lambda a: result(a.describe_consumer_groups([GROUP])), GROUP_DENIED),
    ("DeleteGroups", lambda a: result(a.delete_consumer_groups(["no-such-group"])), GROUP_DENIED),
    ("AlterUserScramCredentials", lambda a: result(a.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"new-password", b"salt-of-sixteen!")])),
     CLUSTER_DENIED),
]


@pytest.mark.parametrize("api, ask, refusal", CASES, ids=[case[0] for case in CASES])
def test_each_admin_api_refuses_a_principal_without_acls_and_answers_a_super_user(broker, api, ask, refusal):
    assert error_code(lambda: ask(AdminClient(config(broker, BOB, BOB_PASSWORD)))) == refusal
    answered = error_code(lambda: ask(AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))))
    assert answered not in (TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED), api


def test_a_listing_leaves_out_what_the_principal_may_not_describe(broker):
    bob, admin = AdminClient(config(broker, BOB, BOB_PASSWORD)), AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))
    assert GROUP not in {g.group_id for g in bob.list_consumer_groups().result(10).valid}
    assert GROUP in {g.group_id for g in admin.list_consumer_groups().result(10).valid}  # the control


def test_a_transactional_producer_needs_write_on_its_transactional_id(broker):
    def init_transactions(user, password):
        Producer({**config(broker, user, password), "transactional.id": TRANSACTION}).init_transactions(15)
    assert error_code(lambda: init_transactions(BOB, BOB_PASSWORD)) == TXN_DENIED
    assert error_code(lambda: init_transactions(ADMIN, ADMIN_PASSWORD)) is None  # the control


def test_a_transaction_needs_write_on_each_topic_and_read_on_the_group_it_commits_for(broker):
    """bob may write as his own transactional id, and only describe the topic: AddPartitionsToTxn is refused with
    TOPIC_AUTHORIZATION_FAILED, TxnOffsetCommit (through AddOffsetsToTxn) with GROUP_AUTHORIZATION_FAILED."""
    admin = AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))
    result(admin.create_acls([AclBinding(ResourceType.TRANSACTIONAL_ID, f"{BOB}s-txn", ResourcePatternType.LITERAL,
                                         f"User:{BOB}", "*", AclOperation.WRITE, AclPermissionType.ALLOW)]))

    def transaction(user=BOB, password=BOB_PASSWORD) -> Producer:
        producer = Producer({**config(broker, user, password), "transactional.id": f"{user}s-txn"})
        producer.init_transactions(15)  # allowed now
        producer.begin_transaction()
        return producer
    control = transaction(ADMIN, ADMIN_PASSWORD)
    control.produce(TOPIC, b"in a transaction", partition=0)
    control.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 1)], Consumer(
        {**config(broker, ADMIN, ADMIN_PASSWORD), "group.id": GROUP}).consumer_group_metadata(), 15)
    control.commit_transaction(15)  # the control: a super user's transaction commits
    writing = transaction()
    writing.produce(TOPIC, b"in a transaction", partition=0)
    assert error_code(lambda: writing.commit_transaction(15)) == TOPIC_DENIED
    committing = transaction()
    metadata = Consumer({**config(broker, BOB, BOB_PASSWORD), "group.id": GROUP}).consumer_group_metadata()
    assert error_code(lambda: committing.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 1)], metadata,
                                                                      15)) == GROUP_DENIED


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(broker):
    def first_error(user, password):
        """librdkafka raises the fatal error the broker's refusal is to an idempotent producer."""
        producer = Producer({**config(broker, user, password), "enable.idempotence": True})
        producer.produce(TOPIC, b"idempotent", partition=1)
        return error_code(lambda: producer.flush(15))
    assert first_error(BOB, BOB_PASSWORD) == CLUSTER_DENIED  # bob may only describe the topic
    assert first_error(ADMIN, ADMIN_PASSWORD) is None  # the control


def raw(broker, user, password, ask):
    """`ask(socket)` on a connection authenticated as the user."""
    with sasl_socket(broker) as sock:
        assert scram_login(sock, MECHANISM, user, password).error_code == 0
        return ask(sock)


def list_offsets(sock):
    request = ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
        name=HIDDEN, partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
    return call(sock, request, ListOffsetsResponse, 7, 5).topics[0].partitions[0].error_code


def describe_scram_users(sock):
    """librdkafka 2.16 crashes (a bad free) on any error answer to DescribeUserScramCredentials: asked raw."""
    return call(sock, DescribeUserScramCredentialsRequest[0](users=None), DescribeUserScramCredentialsResponse, 0,
                5).error_code


def find_coordinator(sock):
    request = FindCoordinatorRequest[4](key_type=0, coordinator_keys=[GROUP])
    return call(sock, request, FindCoordinatorResponse, 4, 5).coordinators[0].error_code


def describe_client_quotas(sock):
    request = DescribeClientQuotasRequest[1](components=[], strict=False)
    return call(sock, request, DescribeClientQuotasResponse, 1, 5).error_code


def describe_producers(sock):
    request = DescribeProducersRequest[0](topics=[DescribeProducersRequest.TopicRequest(name=HIDDEN,
                                                                                         partition_indexes=[0])])
    return call(sock, request, DescribeProducersResponse, 0, 5).topics[0].partitions[0].error_code


def describe_transactions(sock):
    request = DescribeTransactionsRequest[0](transactional_ids=[TRANSACTION])
    return call(sock, request, DescribeTransactionsResponse, 0, 5).transaction_states[0].error_code


def offset_delete(sock):
    request = OffsetDeleteRequest[0](group_id=GROUP, topics=[OffsetDeleteRequest.OffsetDeleteRequestTopic(
        name=TOPIC, partitions=[OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(
            partition_index=1)])])
    return call(sock, request, OffsetDeleteResponse, 0, 5).error_code


RAW_CASES = [(list_offsets, TOPIC_DENIED), (describe_scram_users, CLUSTER_DENIED), (find_coordinator, GROUP_DENIED),
             (describe_client_quotas, CLUSTER_DENIED), (describe_producers, TOPIC_DENIED),
             (describe_transactions, TXN_DENIED), (offset_delete, GROUP_DENIED)]


@pytest.mark.parametrize("ask, refusal", RAW_CASES, ids=[ask.__name__ for ask, _ in RAW_CASES])
def test_raw_requests_are_refused_to_a_principal_without_acls_and_answered_to_a_super_user(broker, ask, refusal):
    assert raw(broker, BOB, BOB_PASSWORD, ask) == refusal
    assert raw(broker, ADMIN, ADMIN_PASSWORD, ask) not in (TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED)


def metadata_by_id(sock, topic: uuid.UUID):
    request = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(topic_id=topic, name=None)],
                                  allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return call(sock, request, MetadataResponse, 12, 5).topics[0]


def test_a_topic_named_by_id_tells_nothing_to_who_may_not_describe_it(broker):
    """Metadata and DeleteTopics by id alone: Kafka answers TOPIC_AUTHORIZATION_FAILED with no name (before, kop
    gave the name and partitions of any topic to whoever sent its id, and named it in the DeleteTopics refusal)."""
    def by_name(sock):
        request = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=HIDDEN)],
                                      allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        return call(sock, request, MetadataResponse, 12, 5).topics[0].topic_id
    known = raw(broker, ADMIN, ADMIN_PASSWORD, by_name)
    assert known != uuid.UUID(int=0)

    def described_and_deleted(sock):
        request = DeleteTopicsRequest[6](topics=[DeleteTopicsRequest.DeleteTopicState(topic_id=known, name=None)],
                                         timeout_ms=5000)
        deleted = call(sock, request, DeleteTopicsResponse, 6, 6).responses[0]
        return metadata_by_id(sock, known), deleted
    described, deleted = raw(broker, BOB, BOB_PASSWORD, described_and_deleted)
    assert (described.error_code, described.name, described.partitions) == (TOPIC_DENIED, None, [])
    assert (deleted.error_code, deleted.name) == (TOPIC_DENIED, None)
    control = raw(broker, ADMIN, ADMIN_PASSWORD, lambda sock: metadata_by_id(sock, known))
    assert (control.error_code, control.name, len(control.partitions)) == (0, HIDDEN, 1)  # told, and not deleted


def test_each_principal_is_told_what_it_may_do(broker):
    """KIP-430, as librdkafka's admin client asks for it: the operations the principal may do on a topic (Metadata),
    on the cluster (DescribeCluster) and on a group (DescribeGroups). bob may only describe the topic; a super user
    may do everything."""
    from confluent_kafka import TopicCollection

    def told(user, password):
        admin = AdminClient(config(broker, user, password))
        topic = admin.describe_topics(TopicCollection([TOPIC]), include_authorized_operations=True)[TOPIC].result(15)
        cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
        return set(topic.authorized_operations), set(cluster.authorized_operations or [])
    assert told(BOB, BOB_PASSWORD) == ({AclOperation.DESCRIBE}, set())
    every_topic_operation = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
                             AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
                             AclOperation.ALTER_CONFIGS}
    every_cluster_operation = {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE,
                               AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                               AclOperation.IDEMPOTENT_WRITE}
    assert told(ADMIN, ADMIN_PASSWORD) == (every_topic_operation, every_cluster_operation)
    admin = AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))
    group = admin.describe_consumer_groups([GROUP], include_authorized_operations=True)[GROUP].result(15)
    assert set(group.authorized_operations) == {AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE}
