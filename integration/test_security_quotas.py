"""Client quotas: set and described with AlterClientQuotas/DescribeClientQuotas, durable, and enforced on real
clients, which are told to wait (throttle_time_ms) when they produce or fetch faster than their byte rate."""
import time

import pytest
from kafka.protocol.admin.client_quotas import (AlterClientQuotasRequest, AlterClientQuotasResponse,
                                                DescribeClientQuotasRequest, DescribeClientQuotasResponse)

from integration import clients
from integration.idem_raw import RawKafka
from protocol.errors import ErrorCode

RATE = 50_000.0  # bytes/s


def alter(broker, entity, ops, validate_only=False):
    Entry = AlterClientQuotasRequest[1].EntryData
    request = AlterClientQuotasRequest[1](entries=[Entry(
        entity=[Entry.EntityData(entity_type=kind, entity_name=name) for kind, name in entity],
        ops=[Entry.OpData(key=key, value=value or 0.0, remove=value is None) for key, value in ops])],
        validate_only=validate_only)
    with RawKafka(broker.port) as raw:
        return raw.call(request, AlterClientQuotasResponse, 1).entries[0]


def describe(broker, components, strict=False):
    Component = DescribeClientQuotasRequest[1].ComponentData
    request = DescribeClientQuotasRequest[1](components=[Component(entity_type=kind, match_type=match_type,
                                                                   match=name)
                                                         for kind, match_type, name in components], strict=strict)
    with RawKafka(broker.port) as raw:
        answer = raw.call(request, DescribeClientQuotasResponse, 1)
    assert answer.error_code == ErrorCode.NONE
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
            for entry in answer.entries}


def produce_throttles(broker, client_id: str) -> list[int]:
    """Throttle times (ms) librdkafka reports while producing 600 KB as `client_id`."""
    return produce_measured(broker.bootstrap, 600, **{"client.id": client_id})[0]


def produce_measured(bootstrap: str, records: int, **config) -> tuple[list[int], float]:
    """Produces `records` records of 1000 bytes with librdkafka: the throttle times (ms) it reports, and the seconds
    from the first produce until every record was acknowledged."""
    from confluent_kafka import Producer
    throttles = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config,
                         "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    started = time.monotonic()
    for i in range(records):
        producer.produce("quota", b"x" * 1000)
        producer.poll(0)
    assert producer.flush(60) == 0
    elapsed = time.monotonic() - started
    producer.poll(0.5)
    return throttles, elapsed


def test_a_client_over_its_produce_rate_is_throttled_and_one_without_a_quota_is_not(broker):
    answer = alter(broker, [("client-id", "slow")], [("producer_byte_rate", RATE)])
    assert answer.error_code == ErrorCode.NONE
    assert describe(broker, [("client-id", 0, "slow")]) == {(("client-id", "slow"),): {"producer_byte_rate": RATE}}
    assert produce_throttles(broker, "fast") == []  # the control: no quota, no throttle
    throttles = produce_throttles(broker, "slow")
    assert throttles and max(throttles) > 0


def test_a_default_user_quota_applies_to_every_user_and_fetches_are_throttled_too(broker):
    alter(broker, [("user", None)], [("consumer_byte_rate", RATE)])
    assert describe(broker, [("user", 1, None)]) == {(("user", None),): {"consumer_byte_rate": RATE}}
    clients.kp_produce(broker.bootstrap, "fetch-quota", [(None, b"y" * 1000, [], 0)] * 500)
    from confluent_kafka import Consumer, TopicPartition
    throttles = []
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "q", "enable.auto.commit": False,
                         "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    consumer.assign([TopicPartition("fetch-quota", 0, 0)])
    read, deadline = 0, time.monotonic() + 60
    while read < 500 and time.monotonic() < deadline:
        read += len(consumer.consume(100, 0.5))
    consumer.close()
    assert read == 500 and throttles and max(throttles) > 0


def test_quotas_are_validated_removed_and_durable(broker):
    refused = alter(broker, [("user", "alice")], [("request_percentage", 10.0)])
    assert refused.error_code == ErrorCode.INVALID_REQUEST and "not served" in refused.error_message
    assert alter(broker, [("user", "alice")], [("producer_byte_rate", 1.0)], validate_only=True).error_code == 0
    assert describe(broker, [("user", 0, "alice")]) == {}  # validate_only stored nothing
    alter(broker, [("user", "alice"), ("client-id", "app")], [("producer_byte_rate", 1000.0)])
    broker.stop()
    broker.start()
    assert describe(broker, [("user", 0, "alice")]) == {
        (("client-id", "app"), ("user", "alice")): {"producer_byte_rate": 1000.0}}
    assert describe(broker, [("user", 0, "alice")], strict=True) == {}  # that entity has a client-id too
    alter(broker, [("user", "alice"), ("client-id", "app")], [("producer_byte_rate", None)])
    assert describe(broker, [("user", 0, "alice")]) == {}


@pytest.mark.slow  # the rate is held for over ten seconds: a throttle starts once the first window's share is spent
def test_a_named_sasl_users_produce_quota_holds_its_rate(tmp_path):
    """The quota of one authenticated user (the principal's name, whatever the client id): its producer is told to
    wait and moves its bytes no faster than about the quota; another user, with no quota, is never throttled."""
    from integration.test_security_sasl import PASSWORD, USER, SaslBroker
    sasl = SaslBroker(str(tmp_path)).start()
    try:
        sasl.set_password(USER, PASSWORD)
        sasl.set_password("bob", "bob-secret")
        rate = 20_000.0
        assert alter(sasl.process, [("user", USER)], [("producer_byte_rate", rate)]).error_code == ErrorCode.NONE
        bootstrap = sasl.bootstrap("SASL_PLAINTEXT")
        # one small batch in flight at a time: what the broker reads past the quota is at most one request
        config = {"batch.size": 10_000, "max.in.flight.requests.per.connection": 1}
        bob = sasl.security("SASL_PLAINTEXT", "SCRAM-SHA-256", user="bob", password="bob-secret").confluent()
        throttles, _ = produce_measured(bootstrap, 100, **config, **bob)
        assert throttles == []  # the control: a user without a quota
        alice = sasl.security("SASL_PLAINTEXT", "SCRAM-SHA-256").confluent()
        records = 13 * int(rate) // 1000  # 13 s of the quota: ten are let through at once (the first window)
        throttles, elapsed = produce_measured(bootstrap, records, **config, **alice)
        assert throttles and max(throttles) > 0
        # A rate ceiling, which a slow machine only lowers: the quota plus the first window's allowance and one
        # request, spread over the time it took, never the megabytes a second of an unthrottled producer.
        assert records * 1000 / elapsed < 1.5 * rate, (records, elapsed)
    finally:
        sasl.process.stop()
