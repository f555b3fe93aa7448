"""Transactions through kill -9: a transaction whose markers could not be written before the crash (its decision
durable, its partitions still showing it open) completes when the broker starts again; a transaction left open by
the crash is aborted by its timeout, and its transactional id is served again."""
import re

import pytest

from integration.idem_raw import RawKafka
from integration.test_dedup_recovery import FAILPOINTS, failpoint
from integration.test_transactions import _latest, send, txn_producer, wait_lso
from integration.txn_clients import READ_COMMITTED, READ_UNCOMMITTED, ck_read_to_end, values


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_transaction_whose_markers_a_crash_stopped_completes_after_restart(start_broker, commit, ck_producers):
    broker = start_broker(FAILPOINTS)
    producer = txn_producer(ck_producers, broker.bootstrap, "prepared")
    producer.begin_transaction()
    send(producer, "prepared", "p", 3)
    failpoint(broker, "prepared", write_failures=1_000_000)  # every marker write fails until the crash
    producer.commit_transaction(15) if commit else producer.abort_transaction(15)
    # Control: EndTxn was answered (the decision is durable) but no marker is stored: the transaction is still open
    # on its partition, so read_committed sees nothing.
    with RawKafka(broker.port) as kafka:
        assert _latest(kafka, "prepared", READ_COMMITTED) == 0
        assert _latest(kafka, "prepared", READ_UNCOMMITTED) == 3
    broker.kill()
    broker.start()
    # One marker: written by the coordinator's recovery, or found stored when the kill came between a retry's write
    # and its failed flush being cut off (the resend is then not stored again).
    wait_lso(broker, "prepared", 4)
    expected = [b"p0", b"p1", b"p2"] if commit else []
    assert values(ck_read_to_end(broker.bootstrap, "prepared")) == expected
    assert len(ck_read_to_end(broker.bootstrap, "prepared", isolation=READ_UNCOMMITTED)) == 3


@pytest.mark.file_storage(reason="a held PostgreSQL commit never reaches the database: the marker is not stored")
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_a_marker_that_reached_the_log_unacknowledged_is_not_written_again_after_restart(start_broker, commit,
                                                                                       ck_producers):
    """The crash lands after the marker reached the log file but before it was acknowledged (its flush stuck): the
    restarted partition finds it, and the coordinator's recovery, which resends it, must not store a second one."""
    broker = start_broker(FAILPOINTS)
    producer = txn_producer(ck_producers, broker.bootstrap, "unacked")
    producer.begin_transaction()
    send(producer, "unacked", "u", 3)
    failpoint(broker, "unacked", hold_flushes=True)  # the marker is written to the file, never flushed
    producer.commit_transaction(15) if commit else producer.abort_transaction(15)
    with RawKafka(broker.port) as kafka:  # control: the marker is not acknowledged, the transaction still open
        assert _latest(kafka, "unacked", READ_COMMITTED) == 0
        assert _latest(kafka, "unacked", READ_UNCOMMITTED) == 3
    broker.kill()
    broker.start()
    # The successor's InitProducerId is answered only once the coordinator completed the transaction: every marker
    # it was to write is stored by then.
    txn_producer(ck_producers, broker.bootstrap, "unacked")
    with open(broker.log_path, errors="replace") as f:  # control: the marker was in the log the restart found
        assert re.search(r"unacked-0: the %s marker of producer \d+ epoch \d+ is stored already; not written again"
                         % ("COMMIT" if commit else "ABORT"), f.read())
    with RawKafka(broker.port) as kafka:
        assert _latest(kafka, "unacked", READ_UNCOMMITTED) == 4  # three records and one marker, not two
        assert _latest(kafka, "unacked", READ_COMMITTED) == 4
    expected = [b"u0", b"u1", b"u2"] if commit else []
    assert values(ck_read_to_end(broker.bootstrap, "unacked")) == expected
    assert len(ck_read_to_end(broker.bootstrap, "unacked", isolation=READ_UNCOMMITTED)) == 3


@pytest.mark.slow  # two kills, and an 8 s transaction timeout to wait out: ~12 s
def test_a_transaction_open_at_the_crash_is_aborted_by_its_timeout_and_its_id_served_again(broker_factory,
                                                                                         ck_producers):
    broker = broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    # the timeout must outlast the kill and restart below (seconds on a loaded machine), or the control finds the
    # transaction already aborted
    producer = txn_producer(ck_producers, broker.bootstrap, "open-crash", **{"transaction.timeout.ms": 8000})
    producer.begin_transaction()
    send(producer, "open-crash", "lost", 2)
    broker.kill()
    broker.start()
    with RawKafka(broker.port) as kafka:  # control: rebuilt from the log, the transaction holds the LSO back
        assert _latest(kafka, "open-crash", READ_COMMITTED) == 0
    wait_lso(broker, "open-crash", 3)
    successor = txn_producer(ck_producers, broker.bootstrap, "open-crash")
    successor.begin_transaction()
    send(successor, "open-crash", "next", 1)
    successor.commit_transaction(15)
    assert values(ck_read_to_end(broker.bootstrap, "open-crash")) == [b"next0"]
    broker.kill()
    broker.start()  # the aborted index and the coordinator's state come back from the logs
    assert values(ck_read_to_end(broker.bootstrap, "open-crash")) == [b"next0"]
    assert values(ck_read_to_end(broker.bootstrap, "open-crash", isolation=READ_UNCOMMITTED)) == \
        [b"lost0", b"lost1", b"next0"]
