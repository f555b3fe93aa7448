"""Idempotent Produce at the protocol level: hand-made batches whose producer id, epoch and sequences the test
picks, sent over a raw socket to a real broker process (answer table:
docs/architecture.md#the-kafka-rules-the-answer-table)."""
import json
import urllib.request

import pytest

from integration.broker_process import BrokerProcess
from integration.idem_raw import ProduceAnswer, RawKafka, idempotent_batch, plain_batch, read_topic
from protocol.errors import ErrorCode

INT32_MAX = 2**31 - 1
TOPIC = "idem-raw"
WINDOW = 5  # Kafka keeps the last 5 batches per producer and partition


class RawProducer:
    """One idempotent producer on one partition: numbers its batches as a client does."""

    def __init__(self, kafka: RawKafka, producer_id: int, epoch: int = 0, sequence: int = 0,
                 partition: int = 0) -> None:
        self.kafka = kafka
        self.producer_id = producer_id
        self.epoch = epoch
        self.sequence = sequence
        self.partition = partition
        self.sent: list[tuple[bytes, int]] = []  # (batch, base offset) of every accepted batch

    def batch(self, values: list[bytes], sequence: int | None = None, epoch: int | None = None) -> bytes:
        return idempotent_batch(values, producer_id=self.producer_id, epoch=self.epoch if epoch is None else epoch,
                                base_sequence=self.sequence if sequence is None else sequence)

    def send(self, values: list[bytes]) -> ProduceAnswer:
        """The next batch in sequence; must be accepted."""
        batch = self.batch(values)
        answer = self.kafka.produce(TOPIC, self.partition, batch)
        assert answer.error_code == ErrorCode.NONE, answer
        self.sent.append((batch, answer.base_offset))
        self.sequence = (self.sequence + len(values)) % (INT32_MAX + 1)
        return answer

    def resend(self, batch: bytes) -> ProduceAnswer:
        return self.kafka.produce(TOPIC, self.partition, batch)


def values(tag: str, n: int = 3) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def stored_values(broker) -> list[bytes]:
    return [r.value for r in read_topic(broker.port, TOPIC, [0])]


@pytest.fixture
def kafka(broker):
    with RawKafka(broker.port) as client:
        assert client.create_topic(TOPIC, 1) == ErrorCode.NONE
        yield client


def new_producer(kafka: RawKafka, version: int = 4) -> RawProducer:
    identity = kafka.init_producer_id(version)
    assert identity.error_code == ErrorCode.NONE and identity.producer_id >= 0 and identity.producer_epoch == 0
    return RawProducer(kafka, identity.producer_id)


def test_retry_of_each_of_the_last_five_batches_gets_its_own_original_offset(broker, kafka):
    producer = new_producer(kafka)
    for i in range(WINDOW + 2):
        producer.send(values(f"b{i}"))
    for batch, offset in reversed(producer.sent[-WINDOW:]):
        assert producer.resend(batch) == ProduceAnswer(ErrorCode.NONE, offset, None)
    assert stored_values(broker) == [v for i in range(WINDOW + 2) for v in values(f"b{i}")]
    assert producer.send(values("next")).base_offset == 3 * (WINDOW + 2)


def test_retry_older_than_the_window_gets_duplicate_sequence_number(broker, kafka):
    producer = new_producer(kafka)
    for i in range(WINDOW + 2):
        producer.send(values(f"b{i}"))
    for batch, _ in producer.sent[:2]:
        assert producer.resend(batch).error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
    assert len(stored_values(broker)) == 3 * (WINDOW + 2)
    producer.send(values("next"))  # the producer goes on in sequence


def test_older_epoch_gets_invalid_producer_epoch(broker, kafka):
    producer = new_producer(kafka)
    producer.send(values("e0"))
    old_batch = producer.sent[-1][0]
    producer.epoch, producer.sequence = 1, 0  # a client-side epoch bump (Java, librdkafka) restarts at 0
    producer.send(values("e1"))
    late = producer.batch(values("late"), sequence=3, epoch=0)
    assert producer.resend(late).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert producer.resend(old_batch).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert stored_values(broker) == values("e0") + values("e1")


def test_new_epoch_not_starting_at_sequence_zero_is_out_of_order(broker, kafka):
    producer = new_producer(kafka)
    producer.send(values("e0"))
    answer = producer.resend(producer.batch(values("e1"), sequence=3, epoch=1))
    assert answer.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    producer.send(values("e0-more"))  # the old epoch is still in force
    assert stored_values(broker) == values("e0") + values("e0-more")


def test_sequence_gap_is_out_of_order_and_does_not_poison_the_producer(broker, kafka):
    producer = new_producer(kafka)
    producer.send(values("a"))
    gap = producer.batch(values("gap"), sequence=5)
    assert producer.resend(gap).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    producer.send(values("b"))
    assert stored_values(broker) == values("a") + values("b")


@pytest.mark.parametrize("start", [INT32_MAX - 2, INT32_MAX - 1], ids=["ends-at-max", "spans-the-wrap"])
def test_sequences_wrap_from_int32_max_to_zero(broker, kafka, start):
    # No state for a producer id: Kafka (>= 2.5) accepts any first sequence, which lets the test start near the end.
    producer = RawProducer(kafka, new_producer(kafka).producer_id, sequence=start)
    producer.send(values("before-wrap"))
    producer.send(values("after-wrap"))
    producer.send(values("later"))
    for batch, offset in producer.sent:
        assert producer.resend(batch) == ProduceAnswer(ErrorCode.NONE, offset, None)
    assert producer.resend(producer.batch(values("gap"), sequence=producer.sequence + 1)).error_code \
        == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert stored_values(broker) == values("before-wrap") + values("after-wrap") + values("later")


def test_batches_without_a_producer_id_bypass_deduplication(broker, kafka):
    batch = plain_batch(values("plain"))
    first, second = kafka.produce(TOPIC, 0, batch), kafka.produce(TOPIC, 0, batch)
    assert (first.error_code, second.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
    assert (first.base_offset, second.base_offset) == (0, 3)
    assert stored_values(broker) == values("plain") * 2


def test_init_producer_id_v0_gives_a_working_id_that_a_restart_never_hands_out_again(broker, kafka):
    producer = new_producer(kafka, version=0)
    producer.send(values("v0"))
    assert producer.resend(producer.sent[-1][0]) == ProduceAnswer(ErrorCode.NONE, 0, None)
    kafka.close()
    broker.restart()
    with RawKafka(broker.port) as again:
        later = [again.init_producer_id(0).producer_id for _ in range(3)]
    assert producer.producer_id not in later and min(later) > producer.producer_id


def dedup_cursor(broker) -> dict:
    """The `pulsar.dedup` cursor of partition 0 (admin API internal stats): mark-delete position and properties."""
    url = f"{broker.admin_url}/admin/v2/persistent/public/default/{TOPIC}-partition-0/internalStats"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["cursors"]["pulsar.dedup"]


@pytest.fixture
def admin_broker(tmp_path):
    """make(config): a broker with the admin API on a free port, stopped at the end."""
    started = []

    def make(config: dict[str, str]) -> BrokerProcess:
        started.append(BrokerProcess(str(tmp_path / "data"), config=config, admin_port=0).start())
        return started[-1]

    yield make
    for proc in started:
        proc.stop()


@pytest.mark.parametrize("hard", [False, True], ids=["restart", "kill-9"])
@pytest.mark.parametrize("entries_interval", [1000, 4], ids=["replay-only", "snapshot-and-replay"])
def test_producer_state_survives_a_broker_restart(admin_broker, hard, entries_interval):
    broker = admin_broker({"brokerDeduplicationEntriesInterval": str(entries_interval)})
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(TOPIC, 1) == ErrorCode.NONE
        producer = new_producer(kafka)
        producer.send(values("e0"))
        producer.epoch, producer.sequence = 1, 0
        for i in range(10):
            producer.send(values(f"b{i}", 2))
    cursor = dedup_cursor(broker)
    snapshot_taken = bool(cursor["properties"])
    assert snapshot_taken == (entries_interval < 11), cursor  # 11 entries: a snapshot only every 4
    if snapshot_taken:  # producer names in the snapshot: only the current epoch's, the bump dropped epoch 0's
        names = [k for k in cursor["properties"] if k.endswith(f"-{producer.producer_id}-0")
                 or k.endswith(f"-{producer.producer_id}-1")]
        assert len(names) == 1 and names[0].endswith("-1"), cursor
    broker.restart(hard=hard)
    with RawKafka(broker.port) as kafka:
        producer.kafka = kafka
        last_batch, last_offset = producer.sent[-1]
        assert producer.resend(last_batch) == ProduceAnswer(ErrorCode.NONE, last_offset, None)
        for batch, offset in producer.sent[-WINDOW:]:
            assert producer.resend(batch) == ProduceAnswer(ErrorCode.NONE, offset, None)
        assert producer.resend(producer.sent[1][0]).error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
        assert producer.resend(producer.batch(values("old"), sequence=3, epoch=0)).error_code \
            == ErrorCode.INVALID_PRODUCER_EPOCH
        assert producer.resend(producer.batch(values("gap"), sequence=producer.sequence + 2)).error_code \
            == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        producer.send(values("after"))
    assert stored_values(broker) == values("e0") + [v for i in range(10) for v in values(f"b{i}", 2)] \
        + values("after")
