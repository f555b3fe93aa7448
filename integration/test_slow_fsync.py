"""Partitions do not wait for each other's disks: with one partition's flush stuck (held in its worker thread by the
`hold_flushes` failpoint, as a hung fsync would be), another partition's appends are still made durable, acknowledged
and readable; the stuck one's record stays invisible and unacknowledged until the flush goes on."""
import pytest

from integration.broker_process import BrokerProcess
from integration.idem_raw import RawKafka, idempotent_batch, plain_batch, read_topic
from integration.waiting import wait_until
from kop.admin.client import AdminClient, topic_resource
from protocol.errors import ErrorCode

TOPIC = "isolated"


@pytest.fixture
def broker(tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0, config={"adminFailpointsEnabled": "true"}).start()
    yield broker
    broker.stop()


def hold(broker: BrokerProcess, partition: int, held: bool) -> None:
    AdminClient(broker.admin_url).post(f"/admin/v2/kop/failpoints/{TOPIC}/{partition}", {"hold_flushes": held})


def entries_written(broker: BrokerProcess, partition: int) -> int:
    """Entries appended to the partition's ledgers, durable or not."""
    stats = AdminClient(broker.admin_url).get(topic_resource(f"{TOPIC}-partition-{partition}", "internalStats"))
    return sum(ledger["entries"] for ledger in stats["ledgers"])


def test_a_stuck_flush_on_one_partition_does_not_hold_up_another(broker):
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(TOPIC, 2) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
    hold(broker, 0, True)
    with RawKafka(broker.port) as stuck, RawKafka(broker.port) as other:
        waiting = stuck.send_produce(TOPIC, 0, plain_batch([b"stuck"]))
        assert wait_until(lambda: entries_written(broker, 0) == 1, timeout=10)  # appended; its flush is held
        for seq in range(5):  # idempotent ones too: dedup state is per partition
            batch = idempotent_batch([b"other%d" % seq], producer_id=pid, epoch=0, base_sequence=seq)
            answer = other.produce(TOPIC, 1, batch)
            assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, seq)
        assert [r.value for r in read_topic(broker.port, TOPIC, [1])] == [b"other%d" % i for i in range(5)]
        # The stuck record is neither acknowledged (acks wait for durability) nor visible to readers.
        assert other.end_offsets(TOPIC, [0, 1]) == {0: 0, 1: 5}
        hold(broker, 0, False)
        answer = stuck.receive_produce(waiting)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
        assert other.end_offsets(TOPIC, [0, 1]) == {0: 1, 1: 5}
    assert [r.value for r in read_topic(broker.port, TOPIC, [0])] == [b"stuck"]
