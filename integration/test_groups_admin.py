"""Group administration through kafka-python's KafkaAdminClient and confluent-kafka's AdminClient against a real
kop process: listing (with state filters), describing (members and their assignments), deleting groups (refused
while members are in them) and their offsets (refused for topics a live group subscribes to), reading every
offset of several groups at once, and resetting an idle group's offsets."""

import pytest

from integration.test_groups_clients import ThreadMember, create_topic, produce
from integration.waiting import wait_for

TOPIC = "admin-topic"




@pytest.fixture
def groups(broker_factory):
    """A topic with records, a live group "live" (one member, Stable, committing) and an idle group "idle" that only
    has offsets (committed by an assign-only consumer)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    broker = broker_factory({"group.min.session.timeout.ms": "1000"})
    create_topic(broker.bootstrap, TOPIC, 3)
    produce(broker.bootstrap, TOPIC, 0, 30, partitions=3)
    member = ThreadMember("kafka-python", broker.bootstrap, TOPIC, "live", "live-member")
    wait_for(lambda: len(member.log.assignment) == 3 and
             len({(d.partition, d.offset) for d in member.log.deliveries}) == 30, "the live member")
    # The tests read the offsets it committed: its one commit must have been acknowledged
    assert all(d.committed for d in member.log.deliveries), f"live member's commits failed: {member.log.commit_errors}"
    idle = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="idle", enable_auto_commit=False)
    idle.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(5 + p, f"m{p}", -1) for p in range(3)})
    idle.close(autocommit=False)
    yield broker, member
    member.leave()


def test_kafka_python_admin_lists_describes_and_deletes_groups_and_offsets(groups):
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import GroupSubscribedToTopicError, NoError
    broker, member = groups
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        listed = {g["group_id"]: (g["protocol_type"], g["group_state"]) for g in admin.list_groups()}
        assert listed == {"live": ("consumer", "Stable"), "idle": ("", "Empty")}
        assert [g["group_id"] for g in admin.list_groups(states_filter=["Stable"])] == ["live"]

        described = admin.describe_groups(["live", "idle", "missing"])
        assert "GroupIdNotFoundError" in described["missing"]["error"]  # DescribeGroups v6
        live = described["live"]
        assert (live["group_state"], live["protocol_type"], live["protocol_data"]) == ("Stable", "consumer", "range")
        (m,) = live["members"]
        assert m["client_host"] == "/127.0.0.1"
        assert m["member_assignment"]["assigned_partitions"] == [{"topic": TOPIC, "partitions": [0, 1, 2]}]
        assert (described["idle"]["group_state"], described["idle"]["members"]) == ("Empty", [])

        offsets = admin.list_group_offsets({"live": None, "idle": None})  # one OffsetFetch v8 for both
        assert {tp.partition: om.offset for tp, om in offsets["live"].items()} == {0: 10, 1: 10, 2: 10}
        assert {tp.partition: (om.offset, om.metadata) for tp, om in offsets["idle"].items()} == \
            {0: (5, "m0"), 1: (6, "m1"), 2: (7, "m2")}

        refused = admin.delete_group_offsets("live", [TopicPartition(TOPIC, 0)])
        assert refused == {TopicPartition(TOPIC, 0): GroupSubscribedToTopicError}
        assert admin.delete_group_offsets("idle", [TopicPartition(TOPIC, 0)]) == {TopicPartition(TOPIC, 0): NoError}
        assert sorted(tp.partition for tp in admin.list_group_offsets({"idle": None})["idle"]) == [1, 2]

        results = admin.delete_groups(["live", "idle", "missing"])
        assert results == {"idle": "OK", "live": "NonEmptyGroupError", "missing": "GroupIdNotFoundError"}
        member.leave()
        wait_for(lambda: [g["group_state"] for g in admin.list_groups()] == ["Empty"], "live to empty")
        assert admin.delete_groups(["live"]) == {"live": "OK"}
        assert admin.list_groups() == []
        assert admin.list_group_offsets({"live": None})["live"] == {}
    finally:
        admin.close()


def test_confluent_admin_lists_describes_alters_and_deletes_groups(groups):
    from confluent_kafka import (ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError, KafkaException,
                                 TopicPartition)
    from confluent_kafka.admin import AdminClient
    broker, member = groups
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert not listed.errors
    by_id = {g.group_id: g for g in listed.valid}
    assert set(by_id) == {"live", "idle"}
    assert by_id["live"].state == ConsumerGroupState.STABLE and not by_id["live"].is_simple_consumer_group
    assert by_id["idle"].state == ConsumerGroupState.EMPTY and by_id["idle"].is_simple_consumer_group
    empty_only = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}, request_timeout=10).result()
    assert [g.group_id for g in empty_only.valid] == ["idle"]

    described = {g: f.result() for g, f in admin.describe_consumer_groups(["live", "idle"], request_timeout=10).items()}
    live = described["live"]
    assert (live.state, live.partition_assignor, live.coordinator.id) == (ConsumerGroupState.STABLE, "range", 1)
    (m,) = live.members
    assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1, 2]
    assert described["idle"].state == ConsumerGroupState.EMPTY and described["idle"].members == []

    fetched = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("idle")], request_timeout=10)
    idle = fetched["idle"].result()
    assert sorted((tp.partition, tp.offset) for tp in idle.topic_partitions) == [(0, 5), (1, 6), (2, 7)]

    # an idle group's offsets can be reset, backwards too; a live group's cannot be touched from outside
    reset = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("idle", [TopicPartition(TOPIC, 1, 1)])], request_timeout=10)
    reset["idle"].result()
    after = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("idle", [TopicPartition(TOPIC, 1)])], request_timeout=10)["idle"].result()
    assert [tp.offset for tp in after.topic_partitions] == [1]
    refused = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("live", [TopicPartition(TOPIC, 1, 1)])], request_timeout=10)
    assert [tp.error.code() for tp in refused["live"].result().topic_partitions] == [KafkaError.UNKNOWN_MEMBER_ID]

    deleted = admin.delete_consumer_groups(["live", "idle"], request_timeout=10)
    deleted["idle"].result()
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP|not empty"):
        deleted["live"].result()
    remaining = admin.list_consumer_groups(request_timeout=10).result()
    assert [g.group_id for g in remaining.valid] == ["live"]


def test_librdkafka_offset_delete_spares_subscribed_topics_and_an_emptied_group_is_gone(groups):
    """OffsetDelete from librdkafka's admin API (rd_kafka_DeleteConsumerGroupOffsets, which confluent-kafka's Python
    AdminClient does not wrap): per-partition errors for topics a live group subscribes to, and a group whose
    last offset is deleted disappears at once, as in Kafka."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient
    from integration.rdkafka_offset_delete import delete_group_offsets
    broker, _member = groups
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def idle_offsets():
        fetched = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("idle")], request_timeout=10)
        return sorted((tp.partition, tp.offset) for tp in fetched["idle"].result().topic_partitions)

    def listed():
        return sorted(g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid)

    deleted = delete_group_offsets(broker.bootstrap, "idle", [(TOPIC, 0), (TOPIC, 1)])
    assert deleted.error is None and deleted.partitions == {(TOPIC, 0): None, (TOPIC, 1): None}
    assert idle_offsets() == [(2, 7)]
    refused = delete_group_offsets(broker.bootstrap, "live", [(TOPIC, 0)])
    assert refused.partitions == {(TOPIC, 0): "GROUP_SUBSCRIBED_TO_TOPIC"}
    missing = delete_group_offsets(broker.bootstrap, "missing", [(TOPIC, 0)])
    assert missing.error == "GROUP_ID_NOT_FOUND"
    assert listed() == ["idle", "live"]
    assert delete_group_offsets(broker.bootstrap, "idle", [(TOPIC, 2)]).partitions == {(TOPIC, 2): None}
    assert listed() == ["live"]
