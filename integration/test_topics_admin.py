"""Topic administration with kafka-python's and confluent-kafka's admin clients: create, delete, add partitions,
describe configs and cluster; auto-creation on and off; many partitions."""
import time

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions
from confluent_kafka.admin import NewTopic as CkNewTopic
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.errors import InvalidPartitionsError, TopicAlreadyExistsError

from integration.clients import ck_consume_all, ck_produce
from protocol.errors import ErrorCode


def wait_all(futures, timeout=20):
    return {k: f.result(timeout=timeout) for k, f in futures.items()}


def test_confluent_admin_create_describe_add_partitions_delete(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("a1", num_partitions=3, replication_factor=1,
                                              config={"retention.ms": "3600000"})]))
    meta = admin.list_topics(timeout=10)
    assert len(meta.topics["a1"].partitions) == 3
    configs = wait_all(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "a1")]))
    entries = next(iter(configs.values()))
    assert entries["retention.ms"].value == "3600000" and not entries["retention.ms"].is_default
    assert entries["cleanup.policy"].value == "delete"
    wait_all(admin.create_partitions([NewPartitions("a1", 5)]))
    assert len(admin.list_topics(timeout=10).topics["a1"].partitions) == 5
    reports = ck_produce(broker.bootstrap, "a1", [(None, b"p4", [], 1_700_000_000_000)], partition=4)
    assert reports[0][0] is None
    wait_all(admin.delete_topics(["a1"]))
    deadline = time.monotonic() + 10
    while "a1" in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "a1" not in admin.list_topics(timeout=10).topics


def test_kafka_python_admin_errors(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("k1", num_partitions=2, replication_factor=1)])
    with pytest.raises(TopicAlreadyExistsError):
        _raise_on_error(admin.create_topics([NewTopic("k1", num_partitions=2, replication_factor=1)]))
    with pytest.raises(InvalidPartitionsError):
        _raise_on_error(admin.create_partitions({"k1": KpNewPartitions(total_count=1)}))
    broker_configs = admin.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "1")],
                                            config_filter="all")["broker"]["1"]
    assert broker_configs["broker.id"]["value"] == "1"
    cluster = admin.describe_cluster()
    assert cluster["cluster_id"] == "kop-standalone"
    assert [b["port"] for b in cluster["brokers"]] == [broker.port]
    admin.delete_topics(["k1"])
    assert "k1" not in admin.list_topics()
    admin.close()


def _raise_on_error(response):
    from kafka.errors import for_code
    for topic in getattr(response, "topics", None) or getattr(response, "results", None) or []:
        if topic.error_code:
            raise for_code(topic.error_code)()
    return response


def test_invalid_creations_are_refused_with_reasons(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([
        CkNewTopic("bad/name", num_partitions=1, replication_factor=1),
        CkNewTopic("zero", num_partitions=0, replication_factor=1),
        CkNewTopic("rf3", num_partitions=1, replication_factor=3),
        CkNewTopic("badcfg", num_partitions=1, replication_factor=1, config={"no.such.config": "1"}),
    ])
    for name, future in futures.items():
        with pytest.raises(Exception) as info:
            future.result(timeout=10)
        assert info.value.args[0].str(), name


def test_auto_creation_can_be_turned_off(broker_factory):
    off = broker_factory({"auto.create.topics.enable": "false", "num.partitions": "2"}, name="off")
    admin = AdminClient({"bootstrap.servers": off.bootstrap})
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": off.bootstrap, "message.timeout.ms": 3000})
    errors = []
    producer.produce("never-created", b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None
    assert "never-created" not in admin.list_topics(timeout=10).topics
    on = broker_factory({"num.partitions": "4"}, name="on")
    ck_produce(on.bootstrap, "auto", [(None, b"x", [], 1)], partition=3)
    assert len(AdminClient({"bootstrap.servers": on.bootstrap}).list_topics(timeout=10).topics["auto"].partitions) == 4


def test_many_partitions(broker):
    from confluent_kafka import Producer
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("wide", num_partitions=200, replication_factor=1)]))
    records = [(f"k{i}".encode(), f"v{i}".encode(), [], 1_700_000_000_000 + i) for i in range(1000)]
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 10})
    for k, v, _, ts in records:
        producer.produce("wide", key=k, value=v, timestamp=ts)
    assert producer.flush(60) == 0
    got = ck_consume_all(broker.bootstrap, "wide", 1000, partitions=range(200), timeout=60)
    assert sorted(r.value for r in got) == sorted(v for _, v, _, _ in records)


def test_manual_assignments_may_name_only_this_broker(broker):
    """Tools that always pass replica assignments (librdkafka's tests, reassignment scripts) work on one broker; an
    assignment naming another broker, or inconsistent with the partition count, is refused as Kafka refuses it."""
    from confluent_kafka import KafkaException

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("assigned", num_partitions=3, replica_assignment=[[1], [1], [1]])]))
    assert len(admin.list_topics(timeout=10).topics["assigned"].partitions) == 3
    wait_all(admin.create_partitions([NewPartitions("assigned", 5, replica_assignment=[[1], [1]])]))
    assert len(admin.list_topics(timeout=10).topics["assigned"].partitions) == 5
    for bad in (admin.create_topics([CkNewTopic("elsewhere", num_partitions=2, replica_assignment=[[1], [2]])]),
                admin.create_partitions([NewPartitions("assigned", 7, replica_assignment=[[1]])]),
                admin.create_partitions([NewPartitions("assigned", 6, replica_assignment=[[1, 2]])])):
        with pytest.raises(KafkaException) as failure:
            wait_all(bad)
        assert failure.value.args[0].name() == "INVALID_REPLICA_ASSIGNMENT"
    assert "elsewhere" not in admin.list_topics(timeout=10).topics
    assert len(admin.list_topics(timeout=10).topics["assigned"].partitions) == 5


def test_topic_configs_can_be_altered_whole_and_incrementally(broker):
    """AlterConfigs replaces a topic's overrides, IncrementalAlterConfigs sets, deletes, appends and subtracts; both
    take effect at once (max.message.bytes here) and survive a restart. Kafka configs kop does not act on are
    stored and reported; unknown ones, bad values and static broker configs are refused."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("altered", num_partitions=1, replication_factor=1,
                                              config={"retention.ms": "3600000", "segment.ms": "1000"})]))

    def describe():
        resource = ConfigResource(ConfigResource.Type.TOPIC, "altered")
        entries = next(iter(wait_all(admin.describe_configs([resource])).values()))
        return {name: e.value for name, e in entries.items() if not e.is_default}

    assert describe() == {"retention.ms": "3600000", "segment.ms": "1000"}
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        # kafka-python sends IncrementalAlterConfigs (and emulates it over AlterConfigs for old brokers)
        kp.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, "altered", configs={"segment.ms": "2000"})])
        assert describe() == {"retention.ms": "3600000", "segment.ms": "2000"}
    finally:
        kp.close()
    # confluent-kafka's alter_configs is AlterConfigs itself, which replaces every override
    resource = ConfigResource(ConfigResource.Type.TOPIC, "altered", set_config={"max.message.bytes": "2000"})
    wait_all(admin.alter_configs([resource]))
    assert describe() == {"max.message.bytes": "2000"}  # AlterConfigs: retention.ms and segment.ms went back
    (report,) = ck_produce(broker.bootstrap, "altered", [(None, b"x" * 3000, [], 0)], retries=0)
    assert report[0] is not None and report[0].name() == "MSG_SIZE_TOO_LARGE"  # a 3000-byte record no longer fits

    changes = ConfigResource(ConfigResource.Type.TOPIC, "altered", incremental_configs=[
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("delete.retention.ms", "900", incremental_operation=AlterConfigOpType.SET)])
    wait_all(admin.incremental_alter_configs([changes]))
    assert describe() == {"cleanup.policy": "delete,compact", "delete.retention.ms": "900"}
    (report,) = ck_produce(broker.bootstrap, "altered", [(b"key", b"x" * 3000, [], 0)])  # compacted: keys needed
    assert report[0] is None

    broker.stop()
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert describe() == {"cleanup.policy": "delete,compact", "delete.retention.ms": "900"}

    refused = [
        ConfigResource(ConfigResource.Type.TOPIC, "altered", incremental_configs=[
            ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource(ConfigResource.Type.TOPIC, "altered", incremental_configs=[
            ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)]),
        ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
            ConfigEntry("socket.request.max.bytes", "4000", incremental_operation=AlterConfigOpType.SET)]),
    ]
    for resource in refused:
        with pytest.raises(KafkaException) as failure:
            wait_all(admin.incremental_alter_configs([resource]))
        assert failure.value.args[0].name() in ("INVALID_CONFIG", "INVALID_REQUEST")
    assert describe() == {"cleanup.policy": "delete,compact", "delete.retention.ms": "900"}


def test_compacted_topics_refuse_records_without_a_key(broker):
    """Kafka's rule, with the reason per record (Produce v8+ record_errors) that librdkafka reports as
    INVALID_RECORD for the keyless record and _INVALID_DIFFERENT_RECORD for the rest of its batch."""
    from confluent_kafka import Producer

    from integration.idem_raw import RawKafka
    from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
    from protocol.records import Record, build_batch
    ProduceRequest, ProduceResponse = REQUEST_CLASSES[0], RESPONSE_CLASSES[0]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("compacted", num_partitions=1, replication_factor=1,
                                              config={"cleanup.policy": "compact"})]))
    reports = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 100})
    for i in range(10):
        producer.produce("compacted", key=None if i == 3 else f"k{i}".encode(), value=b"v", partition=0,
                         on_delivery=lambda err, msg: reports.append(err and err.name()))
    assert producer.flush(30) == 0
    # librdkafka 2.12 tells the records apart by record_errors (its test 0011 checks it); 2.16 fails them all alike
    assert "INVALID_RECORD" in reports and set(reports) <= {"INVALID_RECORD", "_INVALID_DIFFERENT_RECORD"}, reports
    assert len(reports) == 10
    with RawKafka(broker.port) as raw:
        request = ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
            ProduceRequest.TopicProduceData(name="compacted", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=build_batch([
                    Record(offset=i, timestamp=0, key=None if i in (1, 4) else b"k", value=b"v")
                    for i in range(6)]))])])
        answer = raw.call(request, ProduceResponse, 9).responses[0].partition_responses[0]
    assert answer.error_code == ErrorCode.INVALID_RECORD
    reason = "Compacted topic cannot accept message without key"
    assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == [(1, reason), (4, reason)]
    keyed = ck_produce(broker.bootstrap, "compacted", [(b"k", b"v", [], 0)])
    assert keyed[0][0] is None and keyed[0][2] == 0  # nothing of the refused batch was stored


def test_broker_configs_report_their_values_and_where_they_come_from(broker_factory):
    b = broker_factory({"num.partitions": "3"})
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        configs = admin.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "1")],
                                         config_filter="all")["broker"]["1"]
    finally:
        admin.close()
    assert configs["num.partitions"]["value"] == "3"
    assert configs["num.partitions"]["config_source"] == "STATIC_BROKER_CONFIG"  # from the properties file
    assert configs["advertised.listeners"]["value"] == f"PLAINTEXT://127.0.0.1:{b.port}"
    assert configs["advertised.listeners"]["config_source"] == "STATIC_BROKER_CONFIG"  # --listen on the command line
    assert configs["message.max.bytes"]["config_source"] == "DEFAULT_CONFIG"
    assert configs["max.in.flight.bytes.per.connection"]["value"] == str(10 * 1024 * 1024)
    assert configs["queued.max.request.bytes"]["value"] == "-1"
    # read-only exactly where AlterConfigs refuses a change (kop/dynamic)
    assert configs["socket.request.max.bytes"]["read_only"] and configs["broker.id"]["read_only"]
    assert not configs["num.partitions"]["read_only"] and not configs["log.retention.ms"]["read_only"]


def test_delete_records_moves_the_log_start_for_every_reader_and_survives_a_restart(broker):
    from confluent_kafka import KafkaException, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    from integration.clients import kp_consume_all

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("trimmed", num_partitions=2, replication_factor=1)]))
    for partition in (0, 1):
        ck_produce(broker.bootstrap, "trimmed", [(None, b"r%d" % i, [], 0) for i in range(10)], partition=partition)
    deleted = wait_all(admin.delete_records([TopicPartition("trimmed", 0, 4), TopicPartition("trimmed", 1, -1)]))
    assert sorted(d.low_watermark for d in deleted.values()) == [4, 10]
    with pytest.raises(KafkaException) as failure:  # beyond the high watermark
        wait_all(admin.delete_records([TopicPartition("trimmed", 0, 11)]))
    assert failure.value.args[0].name() == "OFFSET_OUT_OF_RANGE"

    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = kp.delete_records({KpTopicPartition("trimmed", 0): 6})
        assert result[KpTopicPartition("trimmed", 0)]["low_watermark"] == 6
    finally:
        kp.close()
    broker.stop()
    broker.start()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, auto_offset_reset="earliest")
    try:
        tps = [KpTopicPartition("trimmed", p) for p in (0, 1)]
        assert consumer.beginning_offsets(tps) == {tps[0]: 6, tps[1]: 10}
        assert consumer.end_offsets(tps) == {tps[0]: 10, tps[1]: 10}
    finally:
        consumer.close()
    records = kp_consume_all(broker.bootstrap, "trimmed", 4, timeout=10)
    assert sorted((r.partition, r.offset) for r in records) == [(0, 6), (0, 7), (0, 8), (0, 9)]


@pytest.mark.file_storage
def test_replica_placement_apis_answer_as_a_single_broker_does(broker):
    """ElectLeaders, DescribeLogDirs, AlterReplicaLogDirs and the partition reassignment APIs: on one broker an
    election is never needed, the one log directory holds every partition, and the only valid reassignment is to
    this broker."""
    from kafka import TopicPartition as KpTopicPartition
    from kafka.errors import ElectionNotNeededError, NoError
    from kafka.structs import TopicPartitionReplica

    ck_produce(broker.bootstrap, "placed", [(None, b"x" * 100, [], 0)])
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        elected = admin.elect_leaders(0, {"placed": [0]})
        assert [(t, [(p[0], p[1]) for p in parts]) for t, parts in elected.replica_election_results] == [
            ("placed", [(0, ElectionNotNeededError.errno)])]

        (described,) = admin.describe_log_dirs()
        assert described["broker"] == 1
        (log_dir,) = described["log_dirs"]
        assert log_dir["error_code"] == ErrorCode.NONE and log_dir["log_dir"].endswith("ledgers")
        sizes = {(t["name"], p["partition_index"]): p["partition_size"]
                 for t in log_dir["topics"] for p in t["partitions"]}
        assert sizes[("placed", 0)] > 100

        replica = TopicPartitionReplica("placed", 0, 1)
        assert admin.alter_replica_log_dirs({replica: log_dir["log_dir"]})[replica] is NoError
        assert admin.alter_replica_log_dirs({replica: "/elsewhere"})[replica] is not NoError

        tp = KpTopicPartition("placed", 0)
        assert admin.alter_partition_reassignments({tp: [1]}) == {tp: None}
        assert admin.alter_partition_reassignments({tp: [2]})[tp] is not None
        assert admin.list_partition_reassignments() == {}
    finally:
        admin.close()


def test_incremental_set_without_a_value_is_refused_not_stored(broker):
    from integration.idem_raw import RawKafka, plain_batch
    from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES

    Req = REQUEST_CLASSES[44][1]
    Resource = Req.AlterConfigsResource
    with RawKafka(broker.port) as raw:
        raw.create_topic("nulls")
        response = raw.call(Req(validate_only=False, resources=[Resource(
            resource_type=2, resource_name="nulls", configs=[
                Resource.AlterableConfig(name="segment.ms", config_operation=0, value=None)])]),
            RESPONSE_CLASSES[44], 1)
        assert [r.error_code for r in response.responses] == [ErrorCode.INVALID_REQUEST]
        assert raw.produce("nulls", 0, plain_batch([b"still serving"])).error_code == ErrorCode.NONE


@pytest.mark.file_storage
def test_a_topic_recreated_after_a_crash_in_the_middle_of_its_deletion_starts_empty(broker):
    """A crash after a deletion removed the topic's metadata but before its ledgers went (the state a kill -9 left
    between the two steps) must not bring the old records back when a topic of that name is created again."""
    import os

    from kafka import KafkaConsumer, TopicPartition

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("phoenix", num_partitions=2, replication_factor=1)]))
    for partition in (0, 1):
        reports = ck_produce(broker.bootstrap, "phoenix", [(None, b"old%d" % i, [], 1_700_000_000_000)
                                                           for i in range(5)], partition=partition)
        assert all(report[0] is None for report in reports)
    broker.kill()
    os.unlink(os.path.join(broker.data_dir, "topics", "public", "default", "phoenix"))
    broker.start()
    ledger_dir = os.path.join(broker.data_dir, "ledgers", "public", "default")
    assert not [d for d in os.listdir(ledger_dir) if d.startswith("phoenix-")]  # orphans removed at load
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("phoenix", num_partitions=2, replication_factor=1)]))
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    tps = [TopicPartition("phoenix", p) for p in (0, 1)]
    try:
        assert consumer.end_offsets(tps) == {tp: 0 for tp in tps}
    finally:
        consumer.close()
    reports = ck_produce(broker.bootstrap, "phoenix", [(None, b"new", [], 1_700_000_000_000)])
    assert reports[0][0] is None
    assert [m.value for m in ck_consume_all(broker.bootstrap, "phoenix", 1)] == [b"new"]


@pytest.mark.file_storage
def test_a_deleted_topic_leaves_nothing_behind_and_comes_back_empty(broker):
    import os

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("gone", num_partitions=1, replication_factor=1)]))
    assert ck_produce(broker.bootstrap, "gone", [(None, b"old", [], 1_700_000_000_000)])[0][0] is None
    wait_all(admin.delete_topics(["gone"]))
    ledger_dir = os.path.join(broker.data_dir, "ledgers", "public", "default")
    assert not [d for d in os.listdir(ledger_dir) if d.startswith("gone-")]
    assert not os.path.exists(os.path.join(broker.data_dir, "topics", "public", "default", "gone"))
    broker.restart(hard=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("gone", num_partitions=1, replication_factor=1)]))
    assert ck_produce(broker.bootstrap, "gone", [(None, b"new", [], 1_700_000_000_000)])[0][0] is None
    assert [m.value for m in ck_consume_all(broker.bootstrap, "gone", 1)] == [b"new"]
