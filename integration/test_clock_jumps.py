"""A jump of the system clock while the broker runs (libfaketime moves the broker process's wall clock, not its
monotonic clock), forward by days and back by a day: retention does not delete every ledger at once and ledgers still
roll by age; time-based dedup snapshots neither storm nor stall; a consumer group's live member is not expelled and a
silent one still is; an open transaction is not aborted early and a timed-out one still is. Each test first shows the
broker saw the jump (a LogAppendTime record carries the jumped time). kop runs these timers on the monotonic clock,
as Kafka does: kop/clock.py (retention, rolls, transaction timeouts), dedup's clock (time.monotonic) and the event
loop's timers (group sessions); each test fails if its timer reads the wall clock instead."""
import os
import re
import time
import urllib.request

import pytest

from integration.broker_process import BrokerProcess
from integration.test_retention import FAST_RETENTION, create, eventually, ledgers, offsets, produce
from integration.idem_raw import RawKafka, idempotent_batch, plain_batch
from integration.test_groups_protocol import call, join
from integration.test_transactions import TIMING_OUT_MS, send, txn_producer, wait_lso
from integration.txn_clients import ck_read_to_end
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"  # Debian's faketime package (make faketime)
DAY_MS = 24 * 3600 * 1000

pytestmark = pytest.mark.skipif(not os.path.exists(FAKETIME), reason="needs Debian's libfaketime (make faketime)")


@pytest.fixture
def clock(tmp_path):
    """The file libfaketime reads the broker's clock offset from, at every call: write "+3d", "-1d", "+0"."""
    path = tmp_path / "faketime"
    path.write_text("+0\n")
    return path


@pytest.fixture
def jumping_broker(broker_factory, clock):
    """Start a broker (with the given config) whose wall clock the `clock` file moves."""
    def start(config: dict[str, str]) -> BrokerProcess:
        proc = broker_factory(config, admin_port=0, env={
            "LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(clock), "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        create(proc, "stamp", **{"message.timestamp.type": "LogAppendTime"})
        return proc

    return start


@pytest.fixture
def broker(jumping_broker):
    return jumping_broker(dict(FAST_RETENTION))


def broker_time_ms(broker) -> int:
    """The broker's wall clock, as the LogAppendTime it gives a record it stores now."""
    with RawKafka(broker.port) as raw:
        answer = raw.produce("stamp", 0, plain_batch([b"t"]))
    assert answer.error_code == ErrorCode.NONE and answer.log_append_time_ms > 0, answer
    return answer.log_append_time_ms


def jump(broker, clock, offset: str, expect_ms: int) -> None:
    """Move the broker's clock by `offset` and wait until it shows (the control: the broker sees the jump)."""
    clock.write_text(offset + "\n")
    assert eventually(lambda: abs(broker_time_ms(broker) - (time.time() * 1000 + expect_ms)) < 60_000)


def test_a_forward_jump_of_days_does_not_delete_every_ledger_at_once(broker, clock):
    create(broker, "kept", **{"retention.ms": "3600000", "segment.bytes": "1000"})
    produce(broker, "kept", 12, size=400)  # about three batches a ledger: several closed ledgers
    assert len(ledgers(broker, "kept")) > 2
    jump(broker, clock, "+3d", 3 * DAY_MS)
    time.sleep(2)  # ten retention checks at 200 ms
    assert offsets(broker, "kept") == (0, 12)  # an hour's retention has not passed for the broker


def test_a_backward_jump_does_not_stop_ledgers_rolling_by_age(broker, clock):
    create(broker, "rolling", **{"segment.ms": "2000", "retention.ms": "3600000"})
    produce(broker, "rolling", 3)
    jump(broker, clock, "-1d", -DAY_MS)

    def rolled() -> bool:  # every record in a closed ledger, a new one open (on a loaded machine the three records
        entries = [l["entries"] for l in ledgers(broker, "rolling")]  # may span a roll already)
        return entries[-1] == 0 and sum(entries) == 3
    # 2 s after its first record the idle ledger rolls, though the clock went back a day since that record
    assert eventually(rolled), ledgers(broker, "rolling")


# Time-based dedup snapshots only (checked every second), none by entry count.
SNAPSHOTS_BY_TIME = {"brokerDeduplicationSnapshotFrequencyInSeconds": "1",
                     "brokerDeduplicationEntriesInterval": "1000000"}
PARTITIONS = 8


def dedup_snapshots(broker, topic: str) -> float:
    """The dedup snapshots the broker stored for `topic`, all partitions (its kop_dedup_snapshots metric)."""
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf'^kop_dedup_snapshots_total{{topic="{re.escape(topic)}"}} (\S+)$', text, re.M)
    return float(found[1]) if found else 0.0


def write_each(raw: RawKafka, topic: str, partitions: int, producer, sequence: int) -> None:
    """One idempotent record to each partition: a new entry the dedup state records."""
    for p in range(partitions):
        batch = idempotent_batch([b"v%d" % sequence], producer_id=producer.producer_id,
                                 epoch=producer.producer_epoch, base_sequence=sequence)
        assert raw.produce(topic, p, batch).error_code == ErrorCode.NONE


def test_a_forward_jump_takes_no_storm_of_time_based_dedup_snapshots(jumping_broker, clock):
    """With an hour's snapshot interval, three days forward must not make every partition's snapshot due at once."""
    broker = jumping_broker({**SNAPSHOTS_BY_TIME, "brokerDeduplicationSnapshotIntervalSeconds": "3600"})
    with RawKafka(broker.port) as raw:
        assert raw.create_topic("snap", PARTITIONS) == ErrorCode.NONE
        producer = raw.init_producer_id()
        write_each(raw, "snap", PARTITIONS, producer, 0)
        before = dedup_snapshots(broker, "snap")
        jump(broker, clock, "+3d", 3 * DAY_MS)
        write_each(raw, "snap", PARTITIONS, producer, 1)  # new entries on every partition
        time.sleep(1.5)  # a snapshot check (every second) or two
        assert dedup_snapshots(broker, "snap") == before  # an hour has not passed for the broker's timers


def test_a_backward_jump_does_not_stop_time_based_dedup_snapshots(jumping_broker, clock):
    """With a one-second snapshot interval, a day back must not hold the next snapshot off for a day."""
    broker = jumping_broker({**SNAPSHOTS_BY_TIME, "brokerDeduplicationSnapshotIntervalSeconds": "1"})
    with RawKafka(broker.port) as raw:
        assert raw.create_topic("snap", 1) == ErrorCode.NONE
        producer = raw.init_producer_id()
        write_each(raw, "snap", 1, producer, 0)
        assert eventually(lambda: dedup_snapshots(broker, "snap") >= 1)  # the timer snapshots before the jump
        jump(broker, clock, "-1d", -DAY_MS)
        taken = dedup_snapshots(broker, "snap")
        write_each(raw, "snap", 1, producer, 1)
        assert eventually(lambda: dedup_snapshots(broker, "snap") > taken)


GROUP_TIMERS = {"group.min.session.timeout.ms": "1000"}


def joined_member(raw: RawKafka, group: str, session_ms: int) -> str:
    """A member that joined `group` alone and synced generation 1; its id."""
    joined = join(raw, 0, group, session=session_ms)
    assert (joined.error_code, joined.generation_id) == (ErrorCode.NONE, 1)
    Sync = REQ[14][0]
    synced = raw.call(Sync(group_id=group, generation_id=1, member_id=joined.member_id, assignments=[
        Sync.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"all")]), RESP[14], 0)
    assert synced.error_code == ErrorCode.NONE
    return joined.member_id


def members(raw: RawKafka, group: str) -> list[str]:
    return [m.member_id for m in call(raw, 15, 0, groups=[group]).groups[0].members]


def test_a_forward_jump_does_not_expel_a_live_group_member(jumping_broker, clock):
    """A member heartbeating well within its 2 s session stays in generation 1 across a jump of a day forward."""
    broker = jumping_broker(GROUP_TIMERS)
    with RawKafka(broker.port) as raw:
        member = joined_member(raw, "live", 2000)
        jump(broker, clock, "+1d", DAY_MS)
        for _ in range(5):  # the first after a pause in which any session check would see the jump; more than a
            time.sleep(0.5)  # session's worth in all
            heartbeat = call(raw, 12, 0, group_id="live", generation_id=1, member_id=member)
            assert heartbeat.error_code == ErrorCode.NONE
        assert members(raw, "live") == [member]


def test_a_backward_jump_does_not_keep_a_silent_member_in_its_group(jumping_broker, clock):
    """A member whose session timer runs when the clock goes back a day, and which never heartbeats again, is
    expelled once its 1 s session ends, not a day later."""
    broker = jumping_broker(GROUP_TIMERS)
    with RawKafka(broker.port) as raw:
        member = joined_member(raw, "silent", 1000)
        assert members(raw, "silent") == [member]
        jump(broker, clock, "-1d", -DAY_MS)
        assert eventually(lambda: members(raw, "silent") == [])


TXN_TIMERS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}


def test_a_forward_jump_does_not_abort_an_open_transaction_early(jumping_broker, clock, ck_producers):
    """A transaction with a minute's timeout, open across a jump of a day forward and several timeout checks,
    still commits."""
    broker = jumping_broker(TXN_TIMERS)
    producer = txn_producer(ck_producers, broker.bootstrap, "open", **{"transaction.timeout.ms": 60_000})
    producer.begin_transaction()
    send(producer, "open", "r", 2)
    jump(broker, clock, "+1d", DAY_MS)
    time.sleep(0.6)  # three timeout checks
    wait_lso(broker, "open", 0)  # still open: not aborted (an abort's marker would move the LSO to 3)
    producer.commit_transaction(15)
    assert [value for _, _, value in ck_read_to_end(broker.bootstrap, "open")] == [b"r0", b"r1"]


def test_a_backward_jump_does_not_keep_a_timed_out_transaction_open(jumping_broker, clock, ck_producers):
    """A transaction with a 5 s timeout, open when the clock goes back a day, is still aborted by the coordinator
    once those seconds have passed, not a day later."""
    broker = jumping_broker(TXN_TIMERS)
    create(broker, "late")  # no topic creation in the transaction's time
    producer = txn_producer(ck_producers, broker.bootstrap, "late", **{"transaction.timeout.ms": TIMING_OUT_MS})
    producer.begin_transaction()
    send(producer, "late", "r", 2)
    jump(broker, clock, "-1d", -DAY_MS)
    wait_lso(broker, "late", 3)  # aborted: the marker moved the LSO past the records
