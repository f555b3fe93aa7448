"""The admin answers Kafka 4.x clients and tools rely on, with real clients: kafka-python infers a 4.x broker,
DescribeTopicPartitions pages through partitions with its cursor, DescribeQuorum names this broker as the quorum,
ListConfigResources lists the broker and the topics, DescribeConfigs says where each value comes from (with
synonyms), an empty cleanup.policy is accepted, and `__consumer_offsets` is listed as internal while reading or
writing it is refused with an error every client names."""
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource
from confluent_kafka.admin import NewTopic as CkNewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError, TopicAuthorizationFailedError
from kafka.protocol.admin import DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from integration.broker_process import BrokerProcess
from integration.clients import ck_produce
from integration.idem_raw import RawKafka
from integration.java_client import java_admin, java_available, java_unavailable_reason
from protocol.errors import ErrorCode

INTERNAL = "__consumer_offsets"


def wait_all(futures, timeout=20):
    return {key: future.result(timeout=timeout) for key, future in futures.items()}


@pytest.fixture
def kp_admin(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield admin
    admin.close()


def test_kafka_python_infers_a_4x_broker(broker):
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        assert consumer.config["api_version"] == (4, 1)
    finally:
        consumer.close()


def test_describe_topic_partitions_pages_through_every_partition_with_the_cursor(broker, kp_admin):
    kp_admin.create_topics([NewTopic("dtp-a", 4, 1), NewTopic("dtp-b", 3, 1)])
    seen, cursor, pages = [], None, 0
    while pages < 10:  # 7 partitions, 3 a page: 3 pages
        answer = kp_admin.describe_topic_partitions(["dtp-b", "dtp-a"], response_partition_limit=3, cursor=cursor)
        pages += 1
        seen += [(t["name"], p["partition_index"]) for t in answer["topics"] for p in t["partitions"]]
        assert all(p["leader_id"] == 1 and p["replica_nodes"] == [1] for t in answer["topics"] for p in t["partitions"])
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == [("dtp-a", p) for p in range(4)] + [("dtp-b", p) for p in range(3)]


def test_describe_topic_partitions_lists_internal_topics_and_refuses_a_foreign_cursor(broker, kp_admin):
    kp_admin.create_topics([NewTopic("dtp-c", 2, 1)])
    everything = kp_admin.describe_topic_partitions([])
    by_name = {t["name"]: t for t in everything["topics"]}
    assert by_name[INTERNAL]["is_internal"] is True and len(by_name[INTERNAL]["partitions"]) == 50
    assert by_name["dtp-c"]["is_internal"] is False and len(by_name["dtp-c"]["partitions"]) == 2
    with RawKafka(broker.port) as kafka:
        request = DescribeTopicPartitionsRequest[0](
            topics=[DescribeTopicPartitionsRequest.TopicRequest(name="dtp-c")], response_partition_limit=10,
            cursor=DescribeTopicPartitionsRequest.Cursor(topic_name="other", partition_index=0))
        answer = kafka.call(request, DescribeTopicPartitionsResponse, 0)
    assert [(t.name, t.error_code) for t in answer.topics] == [("dtp-c", ErrorCode.INVALID_REQUEST)]
    past_the_end = kp_admin.describe_topic_partitions(["dtp-c"], response_partition_limit=10,
                                                      cursor={"topic_name": "dtp-c", "partition_index": 7})
    assert [(t["name"], t["partitions"]) for t in past_the_end["topics"]] == [("dtp-c", [])]
    assert past_the_end["next_cursor"] is None


def test_describe_quorum_names_this_broker_as_the_only_voter_and_leader(kp_admin):
    quorum = kp_admin.describe_metadata_quorum()
    (partition,) = quorum["topics"][0]["partitions"]
    assert quorum["topics"][0]["topic_name"] == "__cluster_metadata"
    assert partition["leader_id"] == 1 and partition["error"] is None
    assert [v["replica_id"] for v in partition["current_voters"]] == [1] and partition["observers"] == []
    assert [n["node_id"] for n in quorum["nodes"]] == [1]


def test_describe_cluster_v2_names_one_unfenced_broker_that_is_the_controller(broker, kp_admin):
    cluster = kp_admin.describe_cluster()
    assert cluster["controller_id"] == 1 and cluster["cluster_id"] == "kop-standalone"
    assert [(b["broker_id"], b["port"], b.get("is_fenced", False)) for b in cluster["brokers"]] == \
        [(1, broker.port, False)]


def test_list_config_resources_lists_the_broker_and_every_topic(kp_admin):
    kp_admin.create_topics([NewTopic("lcr-a", 1, 1), NewTopic("lcr-b", 1, 1)])
    listed = kp_admin.list_config_resources()
    assert listed["broker"] == ["1"]
    assert sorted(listed["topic"]) == [INTERNAL, "lcr-a", "lcr-b"]


def test_list_offsets_earliest_local_is_the_log_start_and_there_is_no_tiered_offset(broker):
    ck_produce(broker.bootstrap, "lo", [(None, b"v%d" % i, [], 0) for i in range(5)])
    answers = []
    with RawKafka(broker.port) as kafka:
        for timestamp in (-4, -5):
            request = ListOffsetsRequest[10](
                replica_id=-1, isolation_level=0, timeout_ms=1000, topics=[ListOffsetsRequest.ListOffsetsTopic(
                    name="lo", partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=timestamp)])])
            (answer,) = kafka.call(request, ListOffsetsResponse, 10).topics[0].partitions
            answers.append((answer.error_code, answer.offset, answer.leader_epoch))
    assert answers == [(ErrorCode.NONE, 0, 0), (ErrorCode.NONE, -1, -1)]


def test_describe_configs_reports_sources_and_synonyms(broker_factory):
    b = broker_factory({"log.retention.ms": "3600000", "group.consumer.migration.policy": "upgrade"})
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("cfg", num_partitions=1, replication_factor=1,
                                              config={"retention.bytes": "1000000"})]))
    resource = ConfigResource("topic", "cfg")
    configs = wait_all(admin.describe_configs([resource]))[resource]
    retention_bytes = configs["retention.bytes"]
    assert (retention_bytes.value, retention_bytes.source) == ("1000000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert [(s.name, s.source) for s in retention_bytes.synonyms.values()] == [
        ("retention.bytes", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.retention.bytes", ConfigSource.DEFAULT_CONFIG.value)]
    retention_ms = configs["retention.ms"]  # no override: the properties file's value, as Kafka reports it
    assert (retention_ms.value, retention_ms.source) == ("3600000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert [(s.name, s.value) for s in retention_ms.synonyms.values()] == [("log.retention.ms", "3600000")]
    assert (configs["min.cleanable.dirty.ratio"].value, configs["delete.retention.ms"].value) == ("0.5", "86400000")
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    broker = ConfigResource("broker", "1")
    group_settings = wait_all(admin.describe_configs([broker]))[broker]
    assert (group_settings["group.consumer.migration.policy"].value,
            group_settings["group.consumer.migration.policy"].source) == \
        ("upgrade", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert (group_settings["group.consumer.assignors"].value, group_settings["group.consumer.assignors"].source) == \
        ("uniform,range", ConfigSource.DEFAULT_CONFIG.value)


def test_an_empty_cleanup_policy_is_accepted_as_kafka_4_accepts_it(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("keep", num_partitions=1, replication_factor=1)]))
    resource = ConfigResource("topic", "keep", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    wait_all(admin.incremental_alter_configs([resource]))
    described = wait_all(admin.describe_configs([ConfigResource("topic", "keep")]))
    (configs,) = described.values()
    assert (configs["cleanup.policy"].value, configs["cleanup.policy"].source) == \
        ("", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    bad = ConfigResource("topic", "keep", incremental_configs=[
        ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception, match="cleanup.policy must be"):
        wait_all(admin.incremental_alter_configs([bad]))


def test_consumer_offsets_is_listed_as_internal_and_reading_or_writing_it_is_refused(broker, kp_admin):
    assert INTERNAL in kp_admin.list_topics()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=5000)
    try:
        assert INTERNAL not in consumer.topics()  # exclude.internal.topics
        consumer.assign([KpTopicPartition(INTERNAL, 0)])
        consumer.seek(KpTopicPartition(INTERNAL, 0), 0)
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.poll(timeout_ms=5000)
    finally:
        consumer.close()
    with pytest.raises(TopicAlreadyExistsError):
        kp_admin.create_topics([NewTopic(INTERNAL, 1, 1)])
    # described as Kafka creates it, so `kafka-topics.sh --describe` of every topic works
    configs = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, INTERNAL)], config_filter="all")
    assert configs["topic"][INTERNAL]["cleanup.policy"]["value"] == "compact"
    assert INTERNAL in kp_admin.list_config_resources()["topic"]
    ck = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader"})
    try:
        ck.assign([TopicPartition(INTERNAL, 0, 0)])
        errors = []
        for _ in range(20):
            message = ck.poll(0.5)
            if message is not None and message.error():
                errors.append(message.error().code())
                break
        assert errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    finally:
        ck.close()
    (report,) = ck_produce(broker.bootstrap, INTERNAL, [(b"k", b"v", [], 0)])
    assert report[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_ck_describe_configs_of_a_broker_set_on_the_command_line(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("broker", "1")
    configs = wait_all(admin.describe_configs([resource]))[resource]
    assert configs["advertised.listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value


def test_kp_describe_configs_without_synonyms_leaves_them_out(kp_admin):
    kp_admin.create_topics([NewTopic("plain", 1, 1)])
    configs = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, "plain")], config_filter="all")
    assert configs["topic"]["plain"]["retention.bytes"]["synonyms"] == []


@pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())
def test_the_java_admin_client_describes_topics_the_quorum_and_config_sources(tmp_path):
    b = BrokerProcess(str(tmp_path / "data"), admin_port=0, config={"log.retention.ms": "3600000"}).start()
    try:
        java_admin_checks(b)
    finally:
        b.stop()


def java_admin_checks(b: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("jadmin", num_partitions=3, replication_factor=1,
                                              config={"retention.bytes": "1000000"})]))
    seen = java_admin(b.bootstrap, "jadmin")
    assert seen["topic_partitions"] == [{"partition": p, "leader": 1, "replicas": 1} for p in range(3)]
    assert seen["internal"] is False
    assert INTERNAL not in seen["topics"] and INTERNAL in seen["topics_with_internal"]
    assert (seen["quorum_leader"], seen["quorum_voters"]) == (1, [1])
    configs = seen["configs"]
    assert configs["retention.bytes"] == {"value": "1000000", "source": "DYNAMIC_TOPIC_CONFIG", "synonyms": [
        ["retention.bytes", "DYNAMIC_TOPIC_CONFIG"], ["log.retention.bytes", "DEFAULT_CONFIG"]]}
    assert configs["retention.ms"] == {"value": "3600000", "source": "STATIC_BROKER_CONFIG",
                                       "synonyms": [["log.retention.ms", "STATIC_BROKER_CONFIG"]]}
    with urllib.request.urlopen(b.admin_url + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    # kafka-clients 3.8+ describes topics with DescribeTopicPartitions when the broker serves it
    assert 'kop_requests_total{api="DescribeTopicPartitions"}' in metrics
