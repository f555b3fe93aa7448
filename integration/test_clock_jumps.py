"""A jump of the system clock while the broker runs (libfaketime moves the broker process's wall clock, not its
monotonic clock): forward by days, retention does not delete every ledger at once; backward by a day, ledgers still
roll by age. Each test first shows the broker saw the jump (a LogAppendTime record carries the jumped time)."""
import os
import time

import pytest

from integration.broker_process import BrokerProcess
from integration.test_retention import FAST_RETENTION, create, eventually, ledgers, offsets, produce
from integration.clients import kp_consume_all
from integration.idem_raw import RawKafka, plain_batch

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
def broker(tmp_path, clock):
    proc = BrokerProcess(str(tmp_path / "data"), admin_port=0, config=dict(FAST_RETENTION),
                         env={"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(clock),
                              "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}).start()
    yield proc
    proc.stop()


def broker_time_ms(broker) -> int:
    """The broker's wall clock, as the LogAppendTime of a record it stores now."""
    with RawKafka(broker.port) as raw:
        raw.produce("stamp", 0, plain_batch([b"t"]))
    stored = offsets(broker, "stamp")[1]
    return kp_consume_all(broker.bootstrap, "stamp", stored)[-1].timestamp


def jump(broker, clock, offset: str, expect_ms: int) -> None:
    """Move the broker's clock by `offset` and wait until it shows (the control: the broker sees the jump)."""
    clock.write_text(offset + "\n")
    assert eventually(lambda: abs(broker_time_ms(broker) - (time.time() * 1000 + expect_ms)) < 60_000)


def test_a_forward_jump_of_days_does_not_delete_every_ledger_at_once(broker, clock):
    create(broker, "stamp", **{"message.timestamp.type": "LogAppendTime"})
    create(broker, "kept", **{"retention.ms": "3600000", "segment.bytes": "1000"})
    produce(broker, "kept", 12, size=400)  # about three batches a ledger: several closed ledgers
    assert len(ledgers(broker, "kept")) > 2
    jump(broker, clock, "+3d", 3 * DAY_MS)
    time.sleep(2)  # ten retention checks at 200 ms
    assert offsets(broker, "kept") == (0, 12)  # an hour's retention has not passed for the broker


def test_a_backward_jump_does_not_stop_ledgers_rolling_by_age(broker, clock):
    create(broker, "stamp", **{"message.timestamp.type": "LogAppendTime"})
    create(broker, "rolling", **{"segment.ms": "500", "retention.ms": "3600000"})
    produce(broker, "rolling", 3)
    jump(broker, clock, "-1d", -DAY_MS)
    # 500 ms after its first record the idle ledger rolls, though the clock went back a day since that record
    assert eventually(lambda: [l["entries"] for l in ledgers(broker, "rolling")] == [3, 0]), ledgers(broker, "rolling")
