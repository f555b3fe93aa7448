"""Dynamic broker configs (kop/dynamic) against a real broker: confluent-kafka's AdminClient changes them with
IncrementalAlterConfigs and AlterConfigs on the broker's resource, kafka-python and hand-made requests describe them,
and each setting kop changes at run time is shown to take effect on the running broker, after a control that shows it
did not hold before. Changes survive kill -9; what Kafka refuses is refused with Kafka's error. The cluster-wide
default (the broker resource with an empty name), which the Python clients cannot name, is set with hand-made
requests and with the Java AdminClient, as kafka-configs.sh --entity-default sets it."""
import socket

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin import NewTopic as CkNewTopic
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from integration.broker_configs import APPEND, DELETE, SET, alter, alter_resources, auto_create, describe
from integration.clients import ck_produce
from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_broker_configs, java_unavailable_reason
from integration.waiting import wait_for
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode

BIG = [(None, b"x" * 3000, [], 0)]  # one 3000-byte record


def wait_all(futures, timeout=20):
    return {key: future.result(timeout=timeout) for key, future in futures.items()}


def incremental(bootstrap: str, *entries: tuple[str, str | None], validate_only: bool = False) -> None:
    """confluent-kafka's IncrementalAlterConfigs of broker 1: (key, value) is a SET, (key, None) a DELETE."""
    ops = [ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET if value is not None
                       else AlterConfigOpType.DELETE) for key, value in entries]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_all(admin.incremental_alter_configs([ConfigResource(ConfigResource.Type.BROKER, "1",
                                                             incremental_configs=ops)], validate_only=validate_only))


def kp_described(bootstrap: str) -> dict[str, dict]:
    """kafka-python's DescribeConfigs of broker 1 with synonyms (a list, where confluent-kafka keys them by name)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "1")], include_synonyms=True,
                                      config_filter="all")["broker"]["1"]
    finally:
        admin.close()


def produced(bootstrap: str, topic: str, records=BIG) -> str | None:
    """The error name of the first record's delivery report (None: stored)."""
    (report, *_rest) = ck_produce(bootstrap, topic, records, retries=0)
    return report[0] and report[0].name()


def test_message_max_bytes_changed_at_run_time_takes_effect_at_once_and_survives_kill_9(broker):
    assert produced(broker.bootstrap, "sized") is None  # the control: 3000 bytes fit the default limit
    incremental(broker.bootstrap, ("message.max.bytes", "2000"))
    assert produced(broker.bootstrap, "sized") == "MSG_SIZE_TOO_LARGE"
    expected = {"value": "2000", "read_only": False, "config_source": "DYNAMIC_BROKER_CONFIG", "is_sensitive": False,
                "config_type": "INT", "documentation": None, "synonyms": [
                    {"name": "message.max.bytes", "value": "2000", "source": "DYNAMIC_BROKER_CONFIG"},
                    {"name": "message.max.bytes", "value": "1048588", "source": "DEFAULT_CONFIG"}]}
    assert kp_described(broker.bootstrap)["message.max.bytes"] == expected
    broker.restart(hard=True)  # kill -9 just after the change was acknowledged
    assert kp_described(broker.bootstrap)["message.max.bytes"] == expected
    assert produced(broker.bootstrap, "sized") == "MSG_SIZE_TOO_LARGE"
    incremental(broker.bootstrap, ("message.max.bytes", None))  # DELETE: back to the level below
    assert produced(broker.bootstrap, "sized") is None
    assert kp_described(broker.bootstrap)["message.max.bytes"]["config_source"] == "DEFAULT_CONFIG"


def test_a_topic_override_wins_over_a_dynamic_default(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("roomy", 1, 1, config={"max.message.bytes": "5000"})]))
    incremental(broker.bootstrap, ("message.max.bytes", "2000"))
    assert produced(broker.bootstrap, "roomy") is None
    (described,) = wait_all(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "roomy")])).values()
    assert (described["max.message.bytes"].value, described["max.message.bytes"].source) == ("5000", 1)
    assert produced(broker.bootstrap, "cramped") == "MSG_SIZE_TOO_LARGE"  # the control: a topic without one


def test_alter_configs_replaces_the_brokers_level_and_validate_only_changes_nothing(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.BROKER, "1",
                              set_config={"num.partitions": "3", "auto.create.topics.enable": "false"})
    wait_all(admin.alter_configs([resource], validate_only=True))
    assert auto_create(broker.port, "unchanged") == (ErrorCode.NONE, 1)
    wait_all(admin.alter_configs([ConfigResource(ConfigResource.Type.BROKER, "1",
                                                 set_config={"num.partitions": "3"})]))
    assert auto_create(broker.port, "three") == (ErrorCode.NONE, 3)
    # AlterConfigs replaces the level: num.partitions goes back to its default
    wait_all(admin.alter_configs([ConfigResource(ConfigResource.Type.BROKER, "1",
                                                 set_config={"auto.create.topics.enable": "false"})]))
    assert auto_create(broker.port, "never") == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
    _, configs = describe(broker.port, "1")
    assert (configs["num.partitions"]["source"], configs["auto.create.topics.enable"]["value"]) == \
        ("DEFAULT_CONFIG", "false")
    wait_all(admin.alter_configs([ConfigResource(ConfigResource.Type.BROKER, "1", set_config={})]))
    assert auto_create(broker.port, "again") == (ErrorCode.NONE, 1)


def test_kafka_python_changes_the_partition_limit_of_new_topics_and_partitions(broker):
    from kafka.admin import NewPartitions, NewTopic
    from kafka.errors import InvalidPartitionsError
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("five", 5, 1)])  # the control: five partitions are allowed
        admin.alter_configs([KpConfigResource(ConfigResourceType.BROKER, "1",
                                              configs={"max.partitions.per.topic": "4"})])
        with pytest.raises(InvalidPartitionsError):
            admin.create_topics([NewTopic("five-more", 5, 1)])
        admin.create_topics([NewTopic("four", 4, 1)])
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"four": NewPartitions(5)})
    finally:
        admin.close()


def test_the_cluster_wide_default_lies_under_the_brokers_own_level(broker):
    assert alter(broker.port, "", ("num.partitions", SET, "3")).error == ErrorCode.NONE
    assert auto_create(broker.port, "from-default") == (ErrorCode.NONE, 3)
    error, default = describe(broker.port, "")
    assert (error, default) == (ErrorCode.NONE, {"num.partitions": {
        "value": "3", "source": "DYNAMIC_DEFAULT_BROKER_CONFIG", "read_only": False,
        "synonyms": [("num.partitions", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG")]}})
    incremental(broker.bootstrap, ("num.partitions", "2"))
    assert auto_create(broker.port, "from-broker") == (ErrorCode.NONE, 2)
    _, configs = describe(broker.port, "1")
    assert configs["num.partitions"]["synonyms"] == [("num.partitions", "2", "DYNAMIC_BROKER_CONFIG"),
                                                     ("num.partitions", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
                                                     ("num.partitions", "1", "DEFAULT_CONFIG")]
    incremental(broker.bootstrap, ("num.partitions", None))
    assert auto_create(broker.port, "from-default-again") == (ErrorCode.NONE, 3)
    assert alter(broker.port, "", ("num.partitions", DELETE, None)).error == ErrorCode.NONE
    assert auto_create(broker.port, "from-static") == (ErrorCode.NONE, 1)
    assert describe(broker.port, "") == (ErrorCode.NONE, {})


@pytest.mark.slow  # a JVM per kafka-configs.sh call
@pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())
def test_the_java_admin_client_sets_and_describes_the_cluster_wide_default(broker):
    changed = java_broker_configs(broker.bootstrap, "", set_configs={"num.partitions": "3"})
    assert changed == {"type": "summary", "error": "none", "configs": {"num.partitions": {
        "value": "3", "source": "DYNAMIC_DEFAULT_BROKER_CONFIG", "read_only": False,
        "synonyms": [["num.partitions", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG"]]}}}
    assert auto_create(broker.port, "from-default") == (ErrorCode.NONE, 3)
    refused = java_broker_configs(broker.bootstrap, "", set_configs={"sasl.kerberos.min.time.before.relogin": "1"},
                                  delete=["num.partitions"])
    assert refused["error"].startswith("InvalidRequestException: Cannot update these configs at default cluster level")
    checked = java_broker_configs(broker.bootstrap, "", delete=["num.partitions"], validate_only=True)
    assert (checked["error"], checked["configs"]) == ("none", changed["configs"])  # validate only: still there
    mine = java_broker_configs(broker.bootstrap, "1", set_configs={"num.partitions": "2"})
    assert mine["configs"]["num.partitions"]["synonyms"] == [["num.partitions", "2", "DYNAMIC_BROKER_CONFIG"],
                                                             ["num.partitions", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG"],
                                                             ["num.partitions", "1", "DEFAULT_CONFIG"]]
    assert auto_create(broker.port, "from-broker") == (ErrorCode.NONE, 2)


@pytest.mark.parametrize("name, ops, error, message", [
    ("1", [("broker.id", SET, "3")], ErrorCode.INVALID_REQUEST, "Cannot update these configs dynamically: broker.id"),
    ("1", [("background.threads", SET, "9")], ErrorCode.INVALID_REQUEST, "Cannot update these configs dynamically"),
    ("1", [("num.partitions", SET, "0")], ErrorCode.INVALID_REQUEST,
     "Invalid value 0 for configuration num.partitions: must be at least 1"),
    ("1", [("num.partitions", SET, "many")], ErrorCode.INVALID_REQUEST, "Invalid value many"),
    ("1", [("num.partitions", SET, "20000")], ErrorCode.INVALID_REQUEST,
     "num.partitions (20000) exceeds max.partitions.per.topic (10000)"),
    ("", [("sasl.kerberos.min.time.before.relogin", SET, "1000")], ErrorCode.INVALID_REQUEST,
     "Cannot update these configs at default cluster level, broker id must be specified"),
    ("2", [("num.partitions", SET, "2")], ErrorCode.INVALID_REQUEST, "Unexpected broker id, expected 1"),
    ("one", [("num.partitions", SET, "2")], ErrorCode.INVALID_REQUEST, "Unexpected broker id, expected 1"),
    ("1", [("num.partitions", APPEND, "2")], ErrorCode.INVALID_CONFIG, "num.partitions is not a list"),
    ("1", [("num.partitions", SET, None)], ErrorCode.INVALID_REQUEST, "Null value not supported for : num.partitions"),
    ("1", [("num.partitions", SET, "2"), ("num.partitions", SET, "3")], ErrorCode.INVALID_REQUEST,
     "Error due to duplicate config keys"),
    ("1", [("num.partitions", SET, "2"), ("socket.request.max.bytes", SET, "1000")], ErrorCode.INVALID_REQUEST,
     "Cannot update these configs dynamically: socket.request.max.bytes"),
], ids=["static", "unknown", "out-of-range", "not-a-number", "breaks-a-rule", "per-broker-on-default",
        "another-broker", "not-a-broker-id", "append-to-a-number", "null", "duplicate-keys", "one-bad-of-two"])
def test_changes_kafka_refuses_are_refused_whole(broker, name, ops, error, message):
    answer = alter(broker.port, name, *ops)
    assert answer.error == error and message in answer.message, answer
    _, configs = describe(broker.port, "1")
    assert configs["num.partitions"]["source"] == "DEFAULT_CONFIG"  # nothing of the change was kept
    assert auto_create(broker.port, "still-one") == (ErrorCode.NONE, 1)


def test_a_resource_named_twice_is_refused_each_time(broker):
    ops = [("num.partitions", SET, "2")]
    answers = alter_resources(broker.port, [("1", ops), ("1", ops)])
    assert [a.error for a in answers] == [ErrorCode.INVALID_REQUEST] * 2
    assert answers[0].message == "Each resource must appear at most once."


def test_confluent_kafka_reports_a_refusal_with_kafkas_error(broker):
    with pytest.raises(KafkaException) as failure:
        incremental(broker.bootstrap, ("advertised.listeners", "PLAINTEXT://elsewhere:9092"))
    assert failure.value.args[0].name() == "INVALID_REQUEST"
    assert kp_described(broker.bootstrap)["advertised.listeners"]["read_only"] is True


def test_validate_only_checks_without_changing(broker):
    assert alter(broker.port, "1", ("num.partitions", SET, "0"), validate_only=True).error == \
        ErrorCode.INVALID_REQUEST
    assert alter(broker.port, "1", ("num.partitions", SET, "4"), validate_only=True).error == ErrorCode.NONE
    incremental(broker.bootstrap, ("num.partitions", "4"), validate_only=True)
    assert auto_create(broker.port, "unvalidated") == (ErrorCode.NONE, 1)
    assert describe(broker.port, "1")[1]["num.partitions"]["source"] == "DEFAULT_CONFIG"


def test_kerberos_keys_are_accepted_per_broker_stored_and_reported(broker):
    """kop has no GSSAPI, as a Kafka broker without a GSSAPI listener has none; like that broker it takes Kafka's
    Kerberos keys on its own resource (librdkafka's 0081_admin sets one) and reports them."""
    incremental(broker.bootstrap, ("sasl.kerberos.min.time.before.relogin", "58000"))
    assert alter(broker.port, "1", ("sasl.kerberos.ticket.renew.jitter", SET, "half")).error == \
        ErrorCode.INVALID_REQUEST  # a double, as Kafka types it
    broker.restart()
    entry = kp_described(broker.bootstrap)["sasl.kerberos.min.time.before.relogin"]
    assert (entry["value"], entry["config_source"], entry["config_type"], entry["read_only"]) == \
        ("58000", "DYNAMIC_BROKER_CONFIG", "LONG", False)


@pytest.mark.slow  # two retention passes at least a second apart, and a ledger rolled before each
def test_log_segment_and_retention_defaults_apply_to_topics_without_overrides(broker_factory):
    """log.segment.bytes and log.retention.bytes: a topic that overrides neither rolls small ledgers and loses the
    oldest; one that overrides both (the control) keeps everything through the same retention passes."""
    broker = broker_factory({"log.retention.check.interval.ms": "1000"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("follows", 1, 1), CkNewTopic("pinned", 1, 1, config={
        "segment.bytes": str(1 << 30), "retention.bytes": "-1"})]))
    incremental(broker.bootstrap, ("log.segment.bytes", "1024"), ("log.retention.bytes", "2048"))
    trimmed_twice_retained_pinned(broker, [(None, b"r" * 200, [], 0)] * 20)


@pytest.mark.slow
def test_log_roll_and_retention_age_defaults_apply_to_topics_without_overrides(broker_factory):
    broker = broker_factory({"log.retention.check.interval.ms": "1000"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wait_all(admin.create_topics([CkNewTopic("follows", 1, 1), CkNewTopic("pinned", 1, 1, config={
        "segment.ms": str(7 * 24 * 3600 * 1000), "retention.ms": "-1"})]))
    incremental(broker.bootstrap, ("log.roll.ms", "1"), ("log.retention.ms", "0"))
    trimmed_twice_retained_pinned(broker, [(None, b"r", [], 0)])


def trimmed_twice_retained_pinned(broker, records) -> None:
    """Records written to `pinned` and then, in several requests, to `follows` until retention has trimmed `follows`
    twice; `pinned`, written before, went through every pass that did it and lost nothing."""
    with RawKafka(broker.port) as raw:
        for _ in range(3):
            ck_produce(broker.bootstrap, "pinned", records)
        first = 0
        for trim in range(2):
            for _ in range(3):  # separate requests: separate entries, a ledger rolled between them
                ck_produce(broker.bootstrap, "follows", records)
            first = wait_for(lambda: (start := raw.start_offsets("follows", [0])[0]) > first and start,
                             f"retention trim {trim + 1} of follows", timeout=30)
        assert raw.start_offsets("pinned", [0]) == {0: 0}


def served(port: int) -> RawKafka | None:
    """A new connection whose ApiVersions is answered, or None when the broker closed it."""
    raw = RawKafka(port)
    try:
        raw.call(ApiVersionsRequest[0](), ApiVersionsResponse, 0)
        return raw
    except (ConnectionError, OSError):
        raw.close()
        return None


@pytest.mark.parametrize("key", ["max.connections.per.ip", "max.connections"])
def test_connection_limits_apply_to_new_connections(broker, key):
    held = [served(broker.port) for _ in range(3)]
    assert all(held)  # the control: three connections served
    assert alter(broker.port, "1", (key, SET, "4")).error == ErrorCode.NONE  # its own connection is closed after
    try:
        fourth = wait_for(lambda: served(broker.port), "a fourth connection once the altering one closed", 10)
        held.append(fourth)
        assert served(broker.port) is None  # a fifth is closed at once
    finally:
        for connection in held:
            if connection is not None:
                connection.close()


def join(raw: RawKafka, group: str, session_ms: int):
    """JoinGroup v0 (the member id in one round trip)."""
    Req = REQ[11][0]
    return raw.call(Req(group_id=group, session_timeout_ms=session_ms, member_id="", protocol_type="consumer",
                        protocols=[Req.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00")]), RESP[11], 0)


def test_group_session_bounds_and_size_apply_to_the_next_join(broker):
    with RawKafka(broker.port) as raw:
        assert join(raw, "long", 30_000).error_code == ErrorCode.NONE  # the control
        assert alter(broker.port, "1", ("group.max.session.timeout.ms", SET, "20000"),
                     ("group.min.session.timeout.ms", SET, "15000"), ("group.max.size", SET, "1")).error == \
            ErrorCode.NONE
        assert join(raw, "longer", 30_000).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
        assert join(raw, "short", 10_000).error_code == ErrorCode.INVALID_SESSION_TIMEOUT
        assert join(raw, "full", 16_000).error_code == ErrorCode.NONE
        with RawKafka(broker.port) as other:
            assert join(other, "full", 16_000).error_code == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_the_initial_rebalance_delay_applies_to_the_next_new_group(broker):
    with RawKafka(broker.port) as raw:
        assert join(raw, "prompt", 10_000).error_code == ErrorCode.NONE  # the control: answered without a delay
    assert alter(broker.port, "1", ("group.initial.rebalance.delay.ms", SET, "120000")).error == ErrorCode.NONE
    with RawKafka(broker.port, timeout=2) as raw:
        Req = REQ[11][0]
        raw.send(Req(group_id="delayed", session_timeout_ms=10_000, member_id="", protocol_type="consumer",
                     protocols=[Req.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00")]))
        with pytest.raises(socket.timeout):  # held for the two-minute delay
            raw.receive(1, RESP[11], 0)


def test_offset_metadata_max_bytes_applies_to_the_next_commit(broker):
    def commit(raw: RawKafka) -> ErrorCode:
        Req = REQ[8][2]
        Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        answer = raw.call(Req(group_id="meta", generation_id_or_member_epoch=-1, member_id="", retention_time_ms=-1,
                              topics=[Req.OffsetCommitRequestTopic(name="committed", partitions=[
                                  Part(partition_index=0, committed_offset=0, committed_metadata="twelve bytes")])]),
                          RESP[8], 2)
        return ErrorCode(answer.topics[0].partitions[0].error_code)
    with RawKafka(broker.port) as raw:
        raw.create_topic("committed")
        assert commit(raw) == ErrorCode.NONE  # the control
        assert alter(broker.port, "1", ("offset.metadata.max.bytes", SET, "8")).error == ErrorCode.NONE
        assert commit(raw) == ErrorCode.OFFSET_METADATA_TOO_LARGE


def test_consumer_group_heartbeat_and_session_apply_to_the_next_heartbeat(broker):
    from integration.test_groups_consumer_protocol import Member
    with RawKafka(broker.port) as raw:
        raw.create_topic("beats")
        first = Member(raw, "beating", topics=("beats",)).heartbeat()
        assert first.heartbeat_interval_ms == 5000  # the control: the default
        assert alter(broker.port, "1", ("group.consumer.heartbeat.interval.ms", SET, "500"),
                     ("group.consumer.session.timeout.ms", SET, "2000")).error == ErrorCode.NONE
        member = Member(raw, "expiring", topics=("beats",))
        assert member.heartbeat().heartbeat_interval_ms == 500
        # it heartbeats no more: removed after the new 2 s session, well before the old 45 s one
        wait_for(lambda: not described_members(raw, "expiring"), "the silent member's removal", timeout=30)


def described_members(raw: RawKafka, group: str) -> list:
    (described,) = raw.call(REQ[69][0](group_ids=[group], include_authorized_operations=False), RESP[69], 0).groups
    return described.members


def test_transaction_max_timeout_applies_to_the_next_init_producer_id(broker):
    def init(raw: RawKafka, timeout_ms: int) -> ErrorCode:
        answer = raw.call(REQ[22][4](transactional_id="bounded", transaction_timeout_ms=timeout_ms, producer_id=-1,
                                     producer_epoch=-1), RESP[22], 4)
        return ErrorCode(answer.error_code)
    with RawKafka(broker.port) as raw:
        assert init(raw, 60_000) == ErrorCode.NONE  # the control
        assert alter(broker.port, "1", ("transaction.max.timeout.ms", SET, "30000")).error == ErrorCode.NONE
        assert init(raw, 60_000) == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        assert init(raw, 30_000) == ErrorCode.NONE


def test_a_changed_broker_config_is_logged_with_who_changed_it(broker):
    incremental(broker.bootstrap, ("num.partitions", "2"))
    incremental(broker.bootstrap, ("num.partitions", None), ("group.max.size", "10"))
    log = broker.log_tail(200)
    assert "broker configs of broker 1 changed by User:ANONYMOUS: num.partitions=2" in log
    assert "broker configs of broker 1 changed by User:ANONYMOUS: group.max.size=10, num.partitions deleted" in log


def test_broker_configs_need_alter_configs_and_describe_configs_on_the_cluster(tmp_path):
    """Kafka's rights: ALTER_CONFIGS on the cluster to change the broker's configs, DESCRIBE_CONFIGS to read them;
    the change is logged with the principal that made it."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    from integration.test_security_acls import BOB, BOB_PASSWORD, config
    from integration.test_security_sasl import ADMIN, ADMIN_PASSWORD, SaslBroker
    broker = SaslBroker(str(tmp_path), **{"authorizer.enabled": "true"}).start()
    try:
        for user, password in ((ADMIN, ADMIN_PASSWORD), (BOB, BOB_PASSWORD)):
            broker.set_password(user, password)
        bob = AdminClient(config(broker, BOB, BOB_PASSWORD))
        resource = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
            ConfigEntry("group.max.size", "7", incremental_operation=AlterConfigOpType.SET)])

        def refusal(ask) -> str | None:
            try:
                wait_all(ask())
            except KafkaException as exc:
                return exc.args[0].name()
            return None
        assert refusal(lambda: bob.incremental_alter_configs([resource])) == "CLUSTER_AUTHORIZATION_FAILED"
        assert refusal(lambda: bob.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])) == \
            "CLUSTER_AUTHORIZATION_FAILED"
        admin = AdminClient(config(broker, ADMIN, ADMIN_PASSWORD))
        wait_all(admin.create_acls([
            AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{BOB}", "*",
                       operation, AclPermissionType.ALLOW)
            for operation in (AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS)]))
        assert refusal(lambda: bob.incremental_alter_configs([resource])) is None
        (configs,) = wait_all(bob.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])).values()
        assert (configs["group.max.size"].value, configs["group.max.size"].source) == ("7", 2)
        assert f"broker configs of broker 1 changed by User:{BOB}: group.max.size=7" in broker.process.log_tail(200)
    finally:
        broker.process.stop()
