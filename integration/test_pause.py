"""The broker stopped (SIGSTOP) for longer than the clients' request and session timeouts, then continued: the
idempotent producer's timed-out requests are retried into exactly one copy each, at the offsets it was told, and the
two-member consumer group rebalances, resumes and reads everything, with no committed offset ever moving back."""
import os
import signal
import time

import pytest

from integration.broker_process import BrokerProcess
from integration.fault_proxy import FaultProxy
from integration.idem_raw import RawKafka, read_topic
from integration.idem_stream import check_stream
from integration.soak.consumers import SESSION_TIMEOUT_MS, CommitWatcher, ConfluentMember
from integration.soak.producers import ConfluentProducer
from integration.waiting import wait_for
from protocol.errors import ErrorCode

TOPIC = "paused"
PARTITIONS = 4
GROUP = "paused-readers"
PAUSE_S = SESSION_TIMEOUT_MS / 1000 + 4  # past the session timeout (6 s) and the producer's request timeout (5 s)


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_a_pause_past_every_client_timeout_loses_nothing_duplicates_nothing_and_the_group_resumes(tmp_path):
    with FaultProxy() as proxy:
        broker = BrokerProcess(str(tmp_path / "data"), config={"advertised.port": str(proxy.port)})
        producer = members = watcher = None
        try:
            broker.start()
            proxy.upstream_port = broker.port
            with RawKafka(broker.port) as kafka:
                assert kafka.create_topic(TOPIC, PARTITIONS) == ErrorCode.NONE
            producer = ConfluentProducer(proxy.bootstrap, TOPIC)
            members = [ConfluentMember(proxy.bootstrap, GROUP, [TOPIC], f"m{i}", lifetime=600) for i in range(2)]
            watcher = CommitWatcher(proxy.bootstrap, GROUP, [(TOPIC, p) for p in range(PARTITIONS)])
            for thread in (producer, *members, watcher):
                thread.start()
            wait_for(lambda: all(m.received for m in members), "both members to consume", timeout=60)
            before = [m.assignments for m in members]
            connections = proxy.stats().connections

            os.kill(broker.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE_S)
            finally:
                os.kill(broker.proc.pid, signal.SIGCONT)
            # Controls: the group noticed (a new assignment), and the clients gave up on their requests (reconnected).
            wait_for(lambda: any(m.assignments > b for m, b in zip(members, before)), "a rebalance", timeout=60)
            wait_for(lambda: proxy.stats().connections > connections, "the clients to reconnect", timeout=30)
            resumed = len(producer.sent)
            wait_for(lambda: len(producer.sent) > resumed + 200, "more records after the pause", timeout=30)
            producer.stop()
            producer.join(120)
            assert not producer.is_alive() and producer.error is None, producer.error

            check = check_stream(producer.sent, producer.reports, read_topic(broker.port, TOPIC, range(PARTITIONS)))
            print(f"\n[pause {PAUSE_S}s] assignments before={before} after={[m.assignments for m in members]} "
                  f"commits refused={[m.commit_errors for m in members]} {check.summary()}")
            assert check.lost == 0 and check.duplicated == 0 and check.foreign == 0, check.summary()
            assert check.out_of_order == 0 and check.holes == 0 and check.offset_mismatches == 0, check.summary()
            assert check.failed == 0, check.summary()

            with RawKafka(broker.port) as kafka:
                ends = kafka.end_offsets(TOPIC, range(PARTITIONS))
            wait_for(lambda: all(watcher.latest.get((TOPIC, p)) == end for p, end in ends.items()),
                     "the group to commit the end of every partition", timeout=60)
            received = set().union(*(m.received for m in members))
            assert not [r.value for r in producer.reports if r.error is None and r.value not in received]
            assert watcher.backwards == [], f"committed offsets went backwards: {watcher.backwards}"
        finally:
            for thread in (producer, *(members or ()), watcher):
                if thread is not None:
                    thread.stop()
            for thread in (*(members or ()), watcher):
                if thread is not None and thread.is_alive():
                    thread.join(30)
            if broker.proc is not None and broker.proc.poll() is None:
                os.kill(broker.proc.pid, signal.SIGCONT)
            broker.stop()
