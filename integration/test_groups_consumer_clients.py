"""KIP-848's consumer group protocol with real clients against a real kop process: librdkafka (confluent-kafka,
`group.protocol=consumer`) members share the partitions, one joins and leaves, one in another process is killed
(SIGKILL: it never leaves, its session runs out), with both server-side assignors and static membership; every
record is delivered and none is committed by two members (integration/test_groups_clients.py's checks)."""
import time

import pytest

from integration.test_groups_clients import (PARTITIONS, ThreadMember, create_topic, produce,
                                             share_join_leave_kill, wait_balanced, wait_delivered,
                                             check_deliveries)

LIB = "confluent-kafka-consumer-protocol"
FAST = {"group.consumer.session.timeout.ms": "3000", "group.consumer.heartbeat.interval.ms": "500"}


@pytest.fixture
def kip848_broker(broker_factory):
    return broker_factory(FAST)


@pytest.mark.slow  # members join, leave and die one after another: about 30 s
@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_librdkafka_members_share_and_hand_over_partitions(kip848_broker, assignor):
    share_join_leave_kill(kip848_broker.bootstrap, LIB, **{"group.remote.assignor": assignor})


def test_librdkafka_members_split_the_partitions_and_a_leaver_hands_them_over(kip848_broker):
    bootstrap, topic, group = kip848_broker.bootstrap, "kip848-quick", "kip848-quick"
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, 0, 60)
    a = ThreadMember(LIB, bootstrap, topic, group, "a")
    b = ThreadMember(LIB, bootstrap, topic, group, "b")
    try:
        wait_balanced([a, b], "two members")
        wait_delivered([a, b], produced)
        # the admin APIs see a consumer-protocol group (librdkafka describes it with ConsumerGroupDescribe)
        from confluent_kafka import ConsumerGroupState, ConsumerGroupType
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": bootstrap})
        described = admin.describe_consumer_groups([group])[group].result(10)
        assert (described.type, described.state) == (ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE)
        assert sorted(len(m.assignment.topic_partitions) for m in described.members) == [3, 3]
        listed = admin.list_consumer_groups().result(10).valid
        assert [(g.group_id, g.type) for g in listed] == [(group, ConsumerGroupType.CONSUMER)]
        b.leave()
        wait_balanced([a], "b left")
        produced += produce(bootstrap, topic, 60, 60)
        wait_delivered([a, b], produced)
    finally:
        a.leave()
        b.leave()
    check_deliveries([a, b], produced)


def test_a_static_librdkafka_member_comes_back_to_its_partitions(kip848_broker):
    bootstrap, topic, group = kip848_broker.bootstrap, "kip848-static", "kip848-static"
    create_topic(bootstrap, topic)
    a = ThreadMember(LIB, bootstrap, topic, group, "a", **{"group.instance.id": "static-a"})
    b = ThreadMember(LIB, bootstrap, topic, group, "b", **{"group.instance.id": "static-b"})
    back = None
    try:
        wait_balanced([a, b], "two static members")
        before = b.log.assignment
        b.leave()  # a static member's close leaves with epoch -2: its partitions wait for it
        time.sleep(1.5)
        assert len(a.log.assignment) == PARTITIONS // 2, "b's partitions moved while it was away"
        back = ThreadMember(LIB, bootstrap, topic, group, "b2", **{"group.instance.id": "static-b"})
        wait_balanced([a, back], "b came back")
        assert back.log.assignment == before
    finally:
        a.leave()
        b.leave()
        if back is not None:
            back.leave()
