"""The consume-transform-produce loop of the Java client and of confluent-kafka (librdkafka) through faults: kop
killed -9 three times mid-run, 5 % of the answers of every API lost to a cut connection, and (slow) both at once over
20,000 records. The output, read read_committed, must hold every input record exactly once, in order per partition."""
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack

import pytest

from integration.fault_proxy import CutPolicy, FaultProxy
from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_transactions
from integration.txn_clients import assert_each_input_copied_once, ck_copy, ck_read_to_end, \
    two_partition_topics_with_input

BATCH = 50  # records per transaction


def java_copy(bootstrap: str, count: int, deadline_s: float) -> dict:
    return java_transactions(bootstrap, "copy", input="in", output="out", group="copier", count=count, batch=BATCH,
                             deadline_s=int(deadline_s), timeout=deadline_s + 60)


def confluent_copy(bootstrap: str, count: int, deadline_s: float) -> dict:
    return vars(ck_copy(bootstrap, "in", "out", "copier", count, batch=BATCH, deadline_s=deadline_s))


CLIENTS = [pytest.param(java_copy, id="java",
                        marks=pytest.mark.skipif(not java_available(), reason="no Java client harness")),
           pytest.param(confluent_copy, id="confluent-kafka")]

# Every 20th request of any API loses its answer: 5 % of FindCoordinator, AddPartitionsToTxn, Produce, TxnOffsetCommit,
# EndTxn, Fetch, OffsetFetch, heartbeats...
FIVE_PERCENT_OF_EVERY_API = CutPolicy(every=20, max_cuts=10_000, apis=None)


def copy_through_faults(broker_factory, copy: Callable[[str, int, float], dict], count: int, kills: int,
                        cuts: CutPolicy | None, deadline_s: float) -> None:
    with ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy()) if cuts else None
        broker = broker_factory({"advertised.port": str(proxy.port)} if proxy else {})
        bootstrap = broker.bootstrap
        if proxy:
            proxy.upstream_port = broker.port
            bootstrap = proxy.bootstrap
        two_partition_topics_with_input(broker.port, broker.bootstrap, "in", "out", count)
        if proxy:
            proxy.set_policy(cuts)
        result: dict = {}
        runner = threading.Thread(target=lambda: result.update(copy(bootstrap, count, deadline_s)))
        runner.start()
        kills_mid_run = 0
        for kill in range(kills):  # spread over the run: kill k once the output holds k+1 shares of the input
            wait_for_output(broker.port, (kill + 1) * count // (kills + 2), runner)
            kills_mid_run += runner.is_alive()
            broker.restart(hard=True)
        runner.join(deadline_s + 90)
        assert not runner.is_alive(), "the copy loop did not end"
        assert result["copied"] == count, result
        if kills:  # control: each kill came while the loop ran (group members now go on across a restart, so a kill
            # need not make the loop abort a transaction: the coordinator completes or times out what it caught)
            assert kills_mid_run == kills
        if proxy:
            proxy.set_policy(None)
            stats = proxy.stats()
            assert len(stats.cuts_by_api) > 2, stats.cuts_by_api  # control: answers of several APIs were lost
        out = ck_read_to_end(broker.bootstrap, "out", partitions=(0, 1), timeout=90)
    assert_each_input_copied_once(out, count)


def wait_for_output(port: int, records: int, runner: threading.Thread, timeout: float = 120.0) -> None:
    """Wait until the output topic holds `records` records (whatever their transactions' fate)."""
    deadline = time.monotonic() + timeout
    while runner.is_alive() and time.monotonic() < deadline:
        with RawKafka(port) as kafka:
            if sum(kafka.end_offsets("out", (0, 1)).values()) >= records:
                return
        time.sleep(0.1)


@pytest.mark.slow  # about 10-18 s each; make test-slow runs them with the 20,000-record run
@pytest.mark.parametrize("copy", CLIENTS)
def test_copy_loop_through_three_kill_9s_copies_each_record_exactly_once(broker_factory, copy):
    copy_through_faults(broker_factory, copy, count=3000, kills=3, cuts=None, deadline_s=150)


@pytest.mark.slow  # about 10-18 s each; make test-slow runs them with the 20,000-record run
@pytest.mark.parametrize("copy", CLIENTS)
def test_copy_loop_through_lost_answers_of_every_api_copies_each_record_exactly_once(broker_factory, copy):
    copy_through_faults(broker_factory, copy, count=3000, kills=0, cuts=FIVE_PERCENT_OF_EVERY_API, deadline_s=150)


@pytest.mark.slow
# Its own bounds (a 400 s loop, then reads) are past pytest's 300 s default: 255 s on PostgreSQL at load 10
@pytest.mark.timeout(900)
@pytest.mark.parametrize("copy", CLIENTS)
def test_copy_loop_of_20000_records_through_kill_9s_and_lost_answers_copies_each_record_exactly_once(
        broker_factory, copy):
    copy_through_faults(broker_factory, copy, count=20_000, kills=3, cuts=FIVE_PERCENT_OF_EVERY_API, deadline_s=400)
