"""Pulsar's deduplication V1 for Kafka producers, between real brokers: an idempotent confluent-kafka producer
reaches its cluster through one address (a proxy standing for a DNS name or a load balancer) that is switched from
east to west while batches are in flight. The producer keeps its producer id (ids carry their cluster's tag, so no
two clusters hand out the same) and resends its unanswered batches to west, which judges them against what east's
replicator brought, as that producer's own batches: every record is stored once in west. In the second test the
producer's resends reach west before east's copies, which west then drops."""
from collections import Counter

import pytest
from confluent_kafka import Producer

from integration.fault_proxy import FaultProxy
from integration.geo import replicate, start_clusters, topic_stats, wait_for, wait_for_records
from integration.idem_raw import RawKafka, plain_batch, read_topic
from protocol.errors import ErrorCode

pytestmark = pytest.mark.slow  # 10-20 s each: two clusters, a held produce, a switch of address


@pytest.fixture
def behind_one_address(tmp_path):
    proxy = FaultProxy().start()
    brokers = start_clusters(tmp_path, ("east", "west"), {"advertised.port": str(proxy.port)})
    for broker in brokers.values():
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("orders", 1) == ErrorCode.NONE
    proxy.upstream_port = brokers["east"].port
    yield brokers["east"], brokers["west"], proxy
    for broker in brokers.values():
        broker.stop()
    proxy.stop()


def values(broker) -> Counter:
    return Counter(r.value for r in read_topic(broker.port, "orders", range(1)))


def expected(first: int, end: int) -> Counter:
    return Counter(b"v%d" % i for i in range(first, end))


class FailingOverProducer:
    """An idempotent producer of `v<i>` records, delivery reports checked."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                                  "message.timeout.ms": 120_000, "reconnect.backoff.max.ms": 500})
        self.failures: list = []
        self.offsets: dict[int, list[int]] = {}  # by sequence id: the offsets its delivery reports gave

    def send_with_sequence_ids(self, ids: range) -> None:
        """Records `v<i>` carrying the application producer name `orders-app` and sequence id i."""
        for i in ids:
            self.producer.produce("orders", b"v%d" % i, partition=0, on_delivery=self._delivered,
                                  headers=[("kop.producer.name", b"orders-app"), ("kop.sequence.id", b"%d" % i)])
            self.producer.poll(0)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failures.append(err)
        else:
            self.offsets.setdefault(int(msg.value()[1:]), []).append(msg.offset())

    def send(self, first: int, end: int) -> None:
        for i in range(first, end):
            self.producer.produce("orders", b"v%d" % i, partition=0,
                                  on_delivery=lambda err, _msg: err and self.failures.append(err))
            self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(60) == 0
        assert not self.failures, self.failures


def switch_with_batches_in_flight(east, west, proxy, producer: FailingOverProducer, stored_in_west: bool) -> None:
    """Records 100-149 are stored in east but their answers are held; then the address moves to west."""
    proxy.hold_responses(True)
    producer.send(100, 150)
    wait_for(lambda: sum(values(east).values()) == 150, 20, "east to store the held batches")
    if stored_in_west:
        wait_for_records(west, "orders", 1, 150)
    proxy.upstream_port = west.port  # the address now leads to west
    proxy.drop_held()  # the producer never hears east stored them, and resends them
    proxy.hold_responses(False)
    producer.flush()
    assert proxy.stats().produce_requests > 0


def test_a_producer_that_fails_over_after_replication_resends_nothing_twice(behind_one_address):
    east, west, proxy = behind_one_address
    for broker in (east, west):
        replicate(broker, ["east", "west"])
    producer = FailingOverProducer(proxy.bootstrap)
    producer.send(0, 100)
    producer.flush()
    wait_for_records(west, "orders", 1, 100)
    requests_before = proxy.stats().produce_requests
    switch_with_batches_in_flight(east, west, proxy, producer, stored_in_west=True)
    assert proxy.stats().produce_requests > requests_before  # control: it resent, to west
    producer.send(150, 200)  # and goes on there
    producer.flush()
    wait_for_records(east, "orders", 1, 200)  # west's own records go back to east
    for broker in (west, east):
        assert values(broker) == expected(0, 200), sorted((v, c) for v, c in values(broker).items() if c > 1)[:5]


def test_a_producer_that_fails_over_before_replication_has_east_s_copies_dropped(behind_one_address):
    east, west, proxy = behind_one_address
    replicate(west, ["east", "west"])  # east does not replicate to west yet: west gets the resends first
    producer = FailingOverProducer(proxy.bootstrap)
    producer.send(0, 100)
    producer.flush()
    switch_with_batches_in_flight(east, west, proxy, producer, stored_in_west=False)
    assert values(west) == expected(100, 150)  # control: west holds only the resends so far
    replicate(east, ["east", "west"])  # east's copies of 0-149 now arrive: 100-149 are the producer's, here already
    wait_for(lambda: topic_stats(east, "orders")["replication"]["west"]["replicationBacklog"] == 0, 30,
             "east's replicator to catch up")
    assert values(west) == expected(0, 150), sorted((v, c) for v, c in values(west).items() if c > 1)[:5]


@pytest.mark.parametrize("west_killed", [False, True], ids=["west-running", "west-killed-9"])
def test_a_resent_batch_of_only_duplicates_is_answered_in_west_with_west_s_offsets(behind_one_address, west_killed):
    """A batch that repeats records by their application sequence ids is stored in east as an empty batch answered
    with east's offset of the first record. Its answer is lost and the producer resends it to west, which got the
    empty batch from east's replicator: west answers with where that record is in west, not east's offset; also
    after a kill -9 of west (the answer is kept with west's copy of the empty batch, and replayed)."""
    east, west, proxy = behind_one_address
    with RawKafka(west.port) as kafka:  # west's own records first: the clusters' offsets differ
        answer = kafka.produce("orders", 0, plain_batch([b"west:%d" % i for i in range(3)]))
        assert answer is not None and answer.error_code == ErrorCode.NONE
    replicate(east, ["east", "west"])
    producer = FailingOverProducer(proxy.bootstrap)
    producer.send_with_sequence_ids(range(20))
    producer.flush()
    wait_for_records(west, "orders", 1, 23)
    proxy.hold_responses(True)
    producer.send_with_sequence_ids(range(5, 10))  # again: all duplicates
    wait_for(lambda: dropped(east) == 5, 20, "east to store the held batch of duplicates")
    wait_for(lambda: topic_stats(east, "orders")["replication"]["west"]["replicationBacklog"] == 0, 20,
             "east's empty batch replicated to west")
    if west_killed:
        west.restart(hard=True)
    requests_before = proxy.stats().produce_requests
    proxy.upstream_port = west.port
    proxy.drop_held()  # the producer never hears east's answer, and resends the batch to west
    proxy.hold_responses(False)
    producer.flush()
    assert proxy.stats().produce_requests > requests_before  # control: it resent, to west
    in_west, in_east = offsets(west), offsets(east)
    assert in_west[b"v5"] != in_east[b"v5"]  # control: east's offsets would show
    assert {i: producer.offsets[i][-1] for i in range(5, 10)} == {i: in_west[b"v%d" % i] for i in range(5, 10)}
    assert values(west) == Counter({**expected(0, 20), **{b"west:%d" % i: 1 for i in range(3)}})


def dropped(broker) -> int:
    stats = topic_stats(broker, "orders")["partitions"]
    return sum(p["namedSequences"]["duplicatesDropped"] for p in stats.values())


def offsets(broker) -> dict[bytes, int]:
    return {r.value: r.offset for r in read_topic(broker.port, "orders", range(1))}
