"""Member sessions around a slow store, against a real kop process on a real PostgreSQL with hand-made requests.

The leader's SyncGroup is answered only once its generation is stored. A client may send no heartbeat while it waits
for that answer (kafka-python pauses its heartbeats from JoinGroup until SyncGroup returns), so the member's session
must run from the answer, as Kafka's coordinator restarts it there: counted from the request, a store of seconds
(PostgreSQL under load) left the member what remained of its session, and it could be expired right after its group
became Stable."""
import contextlib
import os
import select
import signal
import time

import pytest

from integration.idem_raw import RawKafka
from integration.test_groups_protocol import join
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode as E

SESSION_MS = 6000
STALL_S = 3.5  # the store's wait: well inside one session, so the old deadline fell after the answer


def server_processes(data_dir: str) -> list[int]:
    """The PostgreSQL server's postmaster (first line of postmaster.pid) and every process it forked."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == postmaster:
            children.append(int(entry))
    return [postmaster, *children]


@contextlib.contextmanager
def stalled(postgres_server):
    """PostgreSQL stops answering (every process of the server stopped, so no new connection gets through either),
    then goes on where it was."""
    pids = server_processes(postgres_server.data)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def answered(raw: RawKafka) -> bool:
    return bool(select.select([raw], [], [], 0)[0])


@pytest.mark.slow  # a stalled store, then most of a session: about 8 s
def test_a_member_whose_sync_waited_for_a_slow_store_has_a_whole_session_after_the_answer(
        broker_factory, postgres_server, postgres_url):
    broker = broker_factory(options=("--storage", postgres_url))
    group = "slow-store"
    Sync = REQ[14][0]
    with RawKafka(broker.port) as raw:
        raw.create_topic("sessions", 1)
        joined = join(raw, 0, group, session=SESSION_MS)
        assert (joined.error_code, joined.generation_id, joined.leader) == (E.NONE, 1, joined.member_id)
        member = joined.member_id
        with stalled(postgres_server):
            sent = time.monotonic()  # the broker arms the member's session when the SyncGroup arrives
            correlation = raw.send(Sync(group_id=group, generation_id=1, member_id=member, assignments=[
                Sync.SyncGroupRequestAssignment(member_id=member, assignment=b"mine")]))
            time.sleep(STALL_S)
            assert not answered(raw), "control: the SyncGroup must wait for the stalled store"
        synced = raw.receive(correlation, RESP[14], 0)
        assert (synced.error_code, synced.assignment) == (E.NONE, b"mine")
        # Past a session counted from the request, within one counted from the answer (which came ~3.5 s later).
        time.sleep(max(0.0, sent + SESSION_MS / 1000 + 1.5 - time.monotonic()))
        beat = raw.call(REQ[12][0](group_id=group, generation_id=1, member_id=member), RESP[12], 0)
        assert beat.error_code == E.NONE
        left = raw.call(REQ[13][0](group_id=group, member_id=member), RESP[13], 0)
        assert left.error_code == E.NONE
