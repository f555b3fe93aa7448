"""A rolling upgrade of a live consumer group from classic consumers to KIP-848's protocol and back, with real
clients against a real kop process, as a Kafka 4 user does it (`group.consumer.migration.policy=bidirectional`, the
default): classic members (confluent-kafka eager or cooperative, kafka-python, aiokafka) are replaced one by one by
librdkafka members with `group.protocol=consumer` while records keep coming, then the other way round. The group
never stops: it becomes a consumer group when the first consumer-protocol member joins and a classic group again when
the last one leaves. Every record is delivered, none is committed by two members, and no two members of one
generation (member epoch) receive the same record (integration/test_groups_clients.py's checks). A kill -9 of a
classic member and one of the broker land in the middle of the mixed phase."""
import time

import pytest

from integration.test_groups_clients import (ProcessMember, ThreadMember, check_deliveries, create_topic, produce,
                                             wait_balanced, wait_delivered)

CONSUMER = "confluent-kafka-consumer-protocol"
# A consumer-protocol member whose heartbeats stall past its session is fenced; the last one fenced turns the group
# classic again, and its next heartbeat is refused GROUP_ID_NOT_FOUND, fatal to librdkafka (as with Kafka). 3 s
# was too short for a loaded machine (make test-postgres-slow at load 12); members here leave, never expire.
BROKER = {"group.consumer.session.timeout.ms": "15000", "group.consumer.heartbeat.interval.ms": "500",
          "group.min.session.timeout.ms": "1000"}
CLASSIC = {
    "confluent-kafka": ("confluent-kafka", {}),
    "confluent-kafka-cooperative": ("confluent-kafka", {"partition.assignment.strategy": "cooperative-sticky"}),
    "kafka-python": ("kafka-python", {}),
    "aiokafka": ("aiokafka", {}),
}


@pytest.fixture
def migration_broker(broker_factory):
    return broker_factory(BROKER)


def describe(bootstrap: str, group: str):
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(10)


def group_kind(bootstrap: str, group: str) -> str:
    return describe(bootstrap, group).type.name.lower()


def wait_kind(bootstrap: str, group: str, kind: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (seen := group_kind(bootstrap, group)) != kind:
        assert time.monotonic() < deadline, f"group {group} is {seen}, not {kind}"
        time.sleep(0.2)


@pytest.mark.slow  # members replaced one by one, both ways: about 60 s per client
@pytest.mark.parametrize("classic", list(CLASSIC))
def test_a_rolling_upgrade_to_the_consumer_protocol_and_back_without_stopping_the_group(migration_broker, classic):
    bootstrap = migration_broker.bootstrap
    topic = group = f"rolling-{classic}"
    lib, extra = CLASSIC[classic]
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, 0, 60)
    members = []
    batch = [60]

    def more() -> None:
        nonlocal produced
        produced += produce(bootstrap, topic, batch[0], 60)
        batch[0] += 60

    def start(library: str, name: str, **settings) -> ThreadMember:
        member = ThreadMember(library, bootstrap, topic, group, name, **settings)
        members.append(member)
        return member

    try:
        a, b = start(lib, "classic-a", **extra), start(lib, "classic-b", **extra)
        wait_balanced([a, b], "two classic members")
        assert group_kind(bootstrap, group) == "classic"
        more()
        # the upgrade: the first consumer-protocol member joins the live classic group
        c1 = start(CONSUMER, "consumer-1")
        wait_balanced([a, b, c1], "a consumer-protocol member joined the classic members")
        assert group_kind(bootstrap, group) == "consumer"
        more()
        a.leave()
        wait_balanced([b, c1], "a classic member left the mixed group")
        c2 = start(CONSUMER, "consumer-2")
        wait_balanced([b, c1, c2], "a second consumer-protocol member")
        more()
        b.leave()
        wait_balanced([c1, c2], "the last classic member left")
        wait_delivered(members, produced)
        more()
        # the downgrade: classic members come back, and the group turns classic when the last consumer leaves
        d1 = start(lib, "classic-d1", **extra)
        wait_balanced([c1, c2, d1], "a classic member joined the consumer group")
        more()
        c1.leave()
        wait_balanced([c2, d1], "one consumer-protocol member left")
        d2 = start(lib, "classic-d2", **extra)
        wait_balanced([c2, d1, d2], "a second classic member")
        more()
        c2.leave()
        wait_kind(bootstrap, group, "classic")
        wait_balanced([d1, d2], "the group is classic again")
        more()
        wait_delivered(members, produced)
    finally:
        for member in members:
            member.leave()
    for member in members:
        assert member.log.error is None, f"{member.log.name}: {member.log.error!r}"
    check_deliveries(members, produced)


@pytest.mark.slow  # a member's session and a broker restart: about 20 s
@pytest.mark.file_storage(reason="on PostgreSQL a restarted broker takes its groups over as a cluster's new "
                                  "coordinator does: with their epochs, not their members (they rejoin)")
def test_a_mixed_group_survives_a_killed_classic_member_and_a_broker_kill(broker_factory):
    # The survivors' sessions (10 s) outlast the broker's restart and their reconnection, so they go on as the
    # members they were; the killed member's (3 s) runs out quickly.
    broker = broker_factory({**BROKER, "group.consumer.session.timeout.ms": "10000"})
    bootstrap = broker.bootstrap
    topic = group = "mixed-kills"
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, 0, 120)
    a = ThreadMember("confluent-kafka", bootstrap, topic, group, "classic-a", **{"session.timeout.ms": 10000})
    killed = ProcessMember("confluent-kafka", bootstrap, topic, group, "classic-killed")
    members = [a, killed]
    c = None
    try:
        wait_balanced([a, killed], "two classic members")
        c = ThreadMember(CONSUMER, bootstrap, topic, group, "consumer")
        members.append(c)
        wait_balanced([a, killed, c], "a consumer-protocol member joined")
        produced += produce(bootstrap, topic, 120, 120)
        wait_delivered(members, produced)
        killed.kill()  # kill -9: it never leaves, its 3 s classic session runs out inside the consumer group
        wait_balanced([a, c], "the killed classic member's session ran out")
        produced += produce(bootstrap, topic, 240, 120)
        wait_delivered(members, produced)
        before = sorted(m.member_id for m in describe(bootstrap, group).members)
        broker.restart(hard=True)  # kill -9 of the broker: the mixed group's members are restored
        produced += produce(bootstrap, topic, 360, 120)
        wait_delivered(members, produced, timeout=60)
        wait_balanced([a, c], "after the broker restart")
        after = describe(bootstrap, group)
        assert after.type.name.lower() == "consumer"
        # the same members went on: a member the broker had forgotten would have rejoined under a new id
        assert sorted(m.member_id for m in after.members) == before
    finally:
        if killed.proc.poll() is None:
            killed.kill()
        for member in (a, c):
            if member is not None:
                member.leave()
    assert killed.log.deliveries, "the killed member never got records"
    check_deliveries(members, produced)
