"""The FaultProxy the idempotence tests rely on: it drops exactly the Produce responses its policy picks, only
after the broker stored the batch, and passes everything else through with responses matched to requests."""
import pytest

from integration.fault_proxy import BatchIdentity, CutPolicy, FaultProxy
from integration.idem_raw import RawKafka, idempotent_batch, plain_batch, read_topic
from integration.waiting import wait_until
from protocol.errors import ErrorCode

TOPIC = "proxied"


@pytest.fixture
def proxied(broker_factory):
    with FaultProxy() as proxy:
        broker = broker_factory({"advertised.port": str(proxy.port)})
        proxy.upstream_port = broker.port
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic(TOPIC, 1) == ErrorCode.NONE
        yield broker, proxy


def stored(broker) -> list[bytes]:
    return [r.value for r in read_topic(broker.port, TOPIC, [0])]


@pytest.mark.parametrize("version", [3, 8, 9, 10])  # request header v1 and v2 (flexible from v9)
def test_cuts_the_picked_produce_responses_after_the_batch_is_stored(proxied, version):
    broker, proxy = proxied
    proxy.set_policy(CutPolicy(every=2, max_cuts=2, skip_first=1))
    answered, cut = [], []
    client = RawKafka(proxy.port)
    try:
        for i in range(1, 8):
            try:
                assert client.produce(TOPIC, 0, plain_batch([b"v%d" % i]), version=version).error_code == ErrorCode.NONE
                answered.append(i)
            except ConnectionError:
                cut.append(i)
                client.close()
                client = RawKafka(proxy.port)
    finally:
        client.close()
    assert (answered, cut) == ([1, 2, 4, 6, 7], [3, 5])
    assert stored(broker) == [b"v%d" % i for i in range(1, 8)]  # the cut batches were stored all the same
    stats = proxy.stats()
    assert (stats.produce_requests, stats.cuts, stats.connections) == (7, 2, 3)
    assert stats.produce_errors == {ErrorCode.NONE: 5} and stats.order_violations == 0


def test_acks_zero_produce_is_never_picked_and_other_requests_pass(proxied):
    broker, proxy = proxied
    proxy.set_policy(CutPolicy(every=1, max_cuts=1))
    with RawKafka(proxy.port) as client:
        assert client.produce(TOPIC, 0, plain_batch([b"a0"]), acks=0) is None  # no response will come
        assert client.produce(TOPIC, 0, plain_batch([b"a1"]), acks=0) is None
        assert client.init_producer_id().error_code == ErrorCode.NONE  # answered, and matched to its own request
        with pytest.raises(ConnectionError):
            client.produce(TOPIC, 0, plain_batch([b"acked"]))
    assert stored(broker) == [b"a0", b"a1", b"acked"]
    stats = proxy.stats()
    assert (stats.requests, stats.produce_requests, stats.cuts, stats.order_violations) == (4, 1, 1, 0)


def test_responses_pipelined_behind_a_cut_are_lost_with_it(proxied):
    broker, proxy = proxied
    proxy.set_policy(CutPolicy(every=1, max_cuts=1))
    with RawKafka(proxy.port) as client:
        first = client.send_produce(TOPIC, 0, plain_batch([b"p0"]))
        for i in (1, 2):
            client.send_produce(TOPIC, 0, plain_batch([b"p%d" % i]))
        with pytest.raises(ConnectionError):
            client.receive_produce(first)
    assert wait_until(lambda: b"p0" in stored(broker), timeout=10)
    stats = proxy.stats()
    assert stats.cuts == 1 and 1 <= stats.produce_requests <= 3  # the cut may come before all three are read
    assert stats.produce_errors == {}, "no Produce response may reach the client after the cut"


def test_records_which_batches_were_answered_duplicate_sequence_number(proxied):
    """The idempotence test exempts exactly these batches' values from its offset check, so they must be right."""
    broker, proxy = proxied
    with RawKafka(proxy.port) as client:
        pid = client.init_producer_id().producer_id
        for seq in range(0, 12, 2):  # six batches of two: the first falls out of the five kept with offsets
            batch = idempotent_batch([b"s%d" % seq, b"s%d" % (seq + 1)], producer_id=pid, epoch=0, base_sequence=seq)
            assert client.produce(TOPIC, 0, batch).error_code == ErrorCode.NONE
        retry = idempotent_batch([b"s0", b"s1"], producer_id=pid, epoch=0, base_sequence=0)
        assert client.produce(TOPIC, 0, retry).error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
        assert client.produce(TOPIC, 0, idempotent_batch([b"s10", b"s11"], producer_id=pid, epoch=0,
                                                          base_sequence=10)).error_code == ErrorCode.NONE  # its offset
    stats = proxy.stats()
    assert stats.produce_errors == {ErrorCode.NONE: 7, ErrorCode.DUPLICATE_SEQUENCE_NUMBER: 1}
    assert stats.duplicate_sequence_batches == (BatchIdentity(TOPIC, 0, pid, 0, 0, 1),)
    records = read_topic(broker.port, TOPIC, [0])
    assert [(r.value, r.producer_id, r.producer_epoch, r.sequence) for r in records] == [
        (b"s%d" % i, pid, 0, i) for i in range(12)]
