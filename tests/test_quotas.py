"""Quota precedence (Kafka's order) and the throttle a client earns, on a clock the test moves."""
import asyncio

import pytest

from kop.security.quotas import PRODUCE_RATE, QuotaBook, QuotaError, QuotaMeter


@pytest.fixture
def book(tmp_path):
    return QuotaBook(str(tmp_path), durable=False)


@pytest.mark.parametrize("entities, expected", [
    ([(("client-id", None),), (("client-id", "c"),)], 2),  # a named client over the default client
    ([(("client-id", "c"),), (("user", None),)], 2),  # any user entity over client-only ones
    ([(("user", None),), (("user", "u"),)], 2),
    ([(("user", "u"),), (("client-id", None), ("user", "u"))], 2),  # user + default client over user
    ([(("client-id", None), ("user", "u")), (("client-id", "c"), ("user", "u"))], 2),
    ([(("client-id", "c"), ("user", None)), (("user", "u"),)], 2),  # the named user over the default user's
])
def test_the_most_specific_quota_applies(book, entities, expected):
    for value, entity in enumerate(entities, 1):
        asyncio.run(book.alter(entity, {PRODUCE_RATE: float(value)}))
    assert book.limit("u", "c", PRODUCE_RATE) == expected
    assert book.limit("other-user", "other-client", PRODUCE_RATE) in (None, 1.0, 2.0)


def test_entities_and_keys_kafka_refuses(book):
    with pytest.raises(QuotaError):
        asyncio.run(book.alter((("ip", "1.2.3.4"),), {PRODUCE_RATE: 1.0}))
    with pytest.raises(QuotaError):
        asyncio.run(book.alter((("user", "u"),), {"request_percentage": 1.0}))
    with pytest.raises(QuotaError):
        asyncio.run(book.alter((("user", "u"),), {PRODUCE_RATE: 0.0}))


def test_a_client_above_its_rate_is_told_to_wait_in_proportion(book):
    now = [1000.0]
    meter = QuotaMeter(book, clock=lambda: now[0])
    assert meter.record(PRODUCE_RATE, "u", "c", 10**6) == 0  # no quota
    asyncio.run(book.alter((("user", "u"),), {PRODUCE_RATE: 1000.0}))
    assert meter.record(PRODUCE_RATE, "u", "c", 5_000) == 0  # 5,000 B over a 10 s window: within 1,000 B/s
    throttle = meter.record(PRODUCE_RATE, "u", "c", 15_000)  # 20,000 B / 10 s = 2,000 B/s: twice the quota
    assert throttle == 10_000  # (2000 - 1000) / 1000 * the 10 s measured: what brings the rate back to 1,000
    now[0] += 60  # the window has passed: the rate is back to what is sent now
    assert meter.record(PRODUCE_RATE, "u", "c", 100) == 0
