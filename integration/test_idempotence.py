"""Idempotent producers through dropped connections: every value stored exactly once, in send order, every
delivery report of a batch answered NONE names the offset where its value really is, and the partitions' end
offsets (ListOffsets latest and the high watermark) are one past their last stored record.

Clients connect only through a FaultProxy (the broker advertises the proxy's port), which drops the response to
some Produce requests after the broker stored their batch and closes the connection, so each client retries
batches that are already stored. The log is then read straight from the broker's own port. A control run with
idempotence off (retries on) must store duplicates: that proves the cuts hit stored batches.

A batch answered DUPLICATE_SEQUENCE_NUMBER (stored before, older than the five the broker keeps offsets for) has no
offset to give: clients report no offset, or one derived from the -1 they were given. Those values are checked to be
stored exactly once instead; every other acknowledged value must report its stored offset.
"""
from collections import Counter

import pytest

from integration.fault_proxy import CutPolicy, FaultProxy, ProxyStats
from integration.idem_raw import RawKafka, StoredRecord, read_topic
from integration.idem_stream import RUNNERS, Report, check_stream, stream_values
from integration.java_client import java_available, java_unavailable_reason
from protocol.errors import ErrorCode

PARTITIONS = 3
COUNT = 2000
# Produce requests per run differ by client (batching); this cuts often enough for all without slowing them much.
POLICY = CutPolicy(every=4, max_cuts=12, skip_first=3)
MIN_CUTS = 3


@pytest.fixture
def proxied_broker_factory(broker_factory):
    """make(config) -> (broker, proxy): a broker that clients reach only through a FaultProxy."""
    proxies = []

    def make(config: dict[str, str] | None = None):
        proxy = FaultProxy().start()
        proxies.append(proxy)
        broker = broker_factory({"advertised.port": str(proxy.port), **(config or {})}, name=f"data{len(proxies)}")
        proxy.upstream_port = broker.port
        return broker, proxy

    yield make
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def proxied_broker(proxied_broker_factory):
    return proxied_broker_factory()


def _needs_java(client: str) -> None:
    if client == "java" and not java_available():
        pytest.skip(java_unavailable_reason())


def _run(broker, proxy, client: str, topic: str, idempotent: bool, compression: str):
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    values = stream_values(topic, COUNT)
    proxy.set_policy(POLICY)
    reports = RUNNERS[client](proxy.bootstrap, topic, values, idempotent=idempotent, compression=compression)
    proxy.set_policy(None)
    stats = proxy.stats()
    stored = read_topic(broker.port, topic, range(PARTITIONS))
    check = check_stream(values, reports, stored)
    print(f"\n[{client} idempotent={idempotent} compression={compression}] cuts={stats.cuts} "
          f"produce_requests={stats.produce_requests} connections={stats.connections} "
          f"produce_errors={stats.produce_errors} {check.summary()}")
    assert stats.order_violations == 0, "the broker answered out of request order"
    assert stats.cuts >= MIN_CUTS, f"only {stats.cuts} cuts: the run did not exercise retries"
    _assert_end_offsets(broker, topic, stored)
    return stats, check, stored, reports


def _assert_end_offsets(broker, topic: str, stored: list[StoredRecord]) -> None:
    """ListOffsets latest and the high watermark are one past the last stored record of each partition."""
    last = {p: max((r.offset for r in stored if r.partition == p), default=-1) for p in range(PARTITIONS)}
    with RawKafka(broker.port) as kafka:
        latest = kafka.end_offsets(topic, range(PARTITIONS))
        high_watermarks = {p: kafka.fetch_once(topic, p, 0, max_bytes=1)[1] for p in range(PARTITIONS)}
    expected = {p: offset + 1 for p, offset in last.items()}
    assert latest == expected, (latest, expected)
    assert high_watermarks == expected, (high_watermarks, expected)


def _answered_duplicate_sequence(stats: ProxyStats, topic: str, stored: list[StoredRecord]) -> set[bytes]:
    """The values stored by a batch that some retry of it got DUPLICATE_SEQUENCE_NUMBER for."""
    answered = {(b.partition, b.producer_id, b.producer_epoch, seq)
                for b in stats.duplicate_sequence_batches if b.topic == topic
                for seq in range(b.first_sequence, b.last_sequence + 1)}
    return {r.value for r in stored if (r.partition, r.producer_id, r.producer_epoch, r.sequence) in answered}


def _report_offset_errors(reports: list[Report], stored: list[StoredRecord], exempt: set[bytes]) -> list[Report]:
    """Acknowledged values whose report does not name where the value is stored, outside `exempt`."""
    where = {r.value: (r.partition, r.offset) for r in stored}
    return [r for r in reports if r.error is None and r.value not in exempt
            and (r.offset is None or where.get(r.value) != (r.partition, r.offset))]


@pytest.mark.parametrize("compression", ["none", "lz4"])
@pytest.mark.parametrize("client", list(RUNNERS))
def test_idempotent_values_survive_cut_connections_exactly_once_in_order(proxied_broker, client, compression):
    _needs_java(client)
    broker, proxy = proxied_broker
    topic = f"idem-{client}-{compression}"
    stats, check, stored, reports = _run(broker, proxy, client, topic, True, compression)
    assert check.failed == 0, check.summary()
    assert check.lost == 0 and check.foreign == 0, check.summary()
    assert check.duplicated == 0, check.summary()
    assert check.stored == COUNT and check.holes == 0, check.summary()
    assert check.out_of_order == 0, check.summary()
    assert len(check.per_partition) == PARTITIONS, "keys did not spread over every partition"
    assert set(stats.produce_errors) <= {ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER}, stats.produce_errors
    # Every batch answered NONE reports the offsets where its values are; one answered DUPLICATE_SEQUENCE_NUMBER has
    # none to report, and its values must be stored exactly once.
    answered_46 = _answered_duplicate_sequence(stats, topic, stored)
    wrong = _report_offset_errors(reports, stored, answered_46)
    assert not wrong, (len(wrong), wrong[:5])
    copies = Counter(r.value for r in stored)
    assert all(copies[v] == 1 for v in answered_46), [v for v in answered_46 if copies[v] != 1][:5]


@pytest.mark.parametrize("client", ["confluent", "java", "kafka-python", "aiokafka"])
def test_control_without_idempotence_the_same_cuts_store_duplicates(proxied_broker, client):
    _needs_java(client)
    broker, proxy = proxied_broker
    _, check, _, _ = _run(broker, proxy, client, f"plain-{client}", False, "none")
    assert check.lost == 0, check.summary()
    assert check.duplicated > 0, f"cuts did not cause a single duplicate: {check.summary()}"


def test_control_with_broker_dedup_disabled_idempotent_retries_store_duplicates(proxied_broker_factory):
    """The same idempotent stream, with the broker's deduplication switched off: the retries the cuts force are
    stored again, so it is the broker, not the client, that keeps the other runs free of duplicates."""
    broker, proxy = proxied_broker_factory({"brokerDeduplicationEnabled": "false"})
    _, check, _, _ = _run(broker, proxy, "confluent-pipelined", "dedup-off", True, "none")
    assert check.duplicated > 0, f"cuts did not cause a single duplicate: {check.summary()}"
