"""Idempotent producers through dropped connections: every value stored exactly once, in send order, and every
delivery report names the offset where its value really is.

Clients connect only through a FaultProxy (the broker advertises the proxy's port), which drops the response to
some Produce requests after the broker stored their batch and closes the connection, so each client retries
batches that are already stored. The log is then read straight from the broker's own port. A control run with
idempotence off (retries on) must store duplicates: that proves the cuts hit stored batches.
"""
import pytest

from integration.fault_proxy import CutPolicy, FaultProxy
from integration.idem_raw import RawKafka, read_topic
from integration.idem_stream import RUNNERS, check_stream, stream_values
from integration.java_client import java_available, java_unavailable_reason

PARTITIONS = 3
COUNT = 2000
DUPLICATE_SEQUENCE_NUMBER = 46
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
        assert kafka.create_topic(topic, PARTITIONS) == 0
    values = stream_values(topic, COUNT)
    proxy.set_policy(POLICY)
    reports = RUNNERS[client](proxy.bootstrap, topic, values, idempotent=idempotent, compression=compression)
    proxy.set_policy(None)
    stats = proxy.stats()
    check = check_stream(values, reports, read_topic(broker.port, topic, range(PARTITIONS)))
    print(f"\n[{client} idempotent={idempotent} compression={compression}] cuts={stats.cuts} "
          f"produce_requests={stats.produce_requests} connections={stats.connections} "
          f"produce_errors={stats.produce_errors} {check.summary()}")
    assert stats.order_violations == 0, "the broker answered out of request order"
    assert stats.cuts >= MIN_CUTS, f"only {stats.cuts} cuts: the run did not exercise retries"
    return stats, check


@pytest.mark.parametrize("compression", ["none", "lz4"])
@pytest.mark.parametrize("client", list(RUNNERS))
def test_idempotent_values_survive_cut_connections_exactly_once_in_order(proxied_broker, client, compression):
    _needs_java(client)
    broker, proxy = proxied_broker
    stats, check = _run(broker, proxy, client, f"idem-{client}-{compression}", True, compression)
    assert check.failed == 0, check.summary()
    assert check.lost == 0 and check.foreign == 0, check.summary()
    assert check.duplicated == 0, check.summary()
    assert check.stored == COUNT and check.holes == 0, check.summary()
    assert check.out_of_order == 0, check.summary()
    assert len(check.per_partition) == PARTITIONS, "keys did not spread over every partition"
    assert check.offset_mismatches == 0 or stats.produce_errors.get(DUPLICATE_SEQUENCE_NUMBER), check.summary()
    # No offset in a report is allowed only after the broker said DUPLICATE_SEQUENCE_NUMBER.
    assert check.unknown_offsets == 0 or stats.produce_errors.get(DUPLICATE_SEQUENCE_NUMBER), check.summary()
    assert set(stats.produce_errors) <= {0, DUPLICATE_SEQUENCE_NUMBER}, stats.produce_errors


@pytest.mark.parametrize("client", ["confluent", "java", "kafka-python", "aiokafka"])
def test_control_without_idempotence_the_same_cuts_store_duplicates(proxied_broker, client):
    _needs_java(client)
    broker, proxy = proxied_broker
    _, check = _run(broker, proxy, client, f"plain-{client}", False, "none")
    assert check.lost == 0, check.summary()
    assert check.duplicated > 0, f"cuts did not cause a single duplicate: {check.summary()}"


def test_control_with_broker_dedup_disabled_idempotent_retries_store_duplicates(proxied_broker_factory):
    """The same idempotent stream, with the broker's deduplication switched off: the retries the cuts force are
    stored again, so it is the broker, not the client, that keeps the other runs free of duplicates."""
    broker, proxy = proxied_broker_factory({"brokerDeduplicationEnabled": "false"})
    _, check = _run(broker, proxy, "confluent-pipelined", "dedup-off", True, "none")
    assert check.duplicated > 0, f"cuts did not cause a single duplicate: {check.summary()}"
