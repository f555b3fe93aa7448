"""A broker in this process for the `broker` target: request frames reach it over TCP as a client sends them, so every
handler meets what the decoder lets through (negative counts, absurd timeouts, unknown ids, empty names).

The oracle: the broker answers or closes that one connection, and never logs an internal error (a handler that
raised, a task whose exception nobody took), and its event loop goes on turning. It runs on a thread of its
own with its own event loop, over a temporary data directory, with the seeds' topic (two partitions), and its
authorizer on (allowing what no ACL names, so the ACL requests the fuzzer sends take effect).
"""
import asyncio
import atexit
import logging
import shutil
import socket
import struct
import tempfile
import threading
import traceback
from functools import cache

from fuzz.seeds import TOPIC
from kop.broker import Broker
from kop.config import BrokerConfig

ANSWER_WAIT_S = 0.3  # how long a request may take to be answered before the next one is sent (long polls do not)


class InternalError(AssertionError):
    """The broker logged an internal error while it served the input."""


class _Recorder(logging.Handler):
    def __init__(self, errors: list[str]) -> None:
        super().__init__(logging.ERROR)
        self._errors = errors

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self._errors.append(f"{record.getMessage()}\n{''.join(traceback.format_exception(*record.exc_info))}")


class LiveBroker:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="kop-fuzz-broker-")
        self.errors: list[str] = []
        logging.getLogger().addHandler(_Recorder(self.errors))  # the broker's, and asyncio's unretrieved tasks
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="kop-fuzz-broker", daemon=True).start()
        # with the authorizer on, allowing what no ACL names: every request passes through its checks and goes on
        self.broker = Broker(BrokerConfig(port=0, admin_port=-1, fsync=False, data_dir=self.directory,
                                          authorizer_enabled=True, allow_everyone_if_no_acl_found=True))
        self._run(self.broker.start())
        self._run(self.broker.topics.create(TOPIC, 2, {}))
        self.port = self.broker.port

    def _run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def send(self, frame: bytes) -> None:
        """One frame on a connection of its own; waits for the answer, the close, or ANSWER_WAIT_S."""
        self.errors.clear()  # logged before this input (in a test process, by other tests): not this input's
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            sock.settimeout(ANSWER_WAIT_S)
            try:
                _read_answer(sock)
            except (TimeoutError, ConnectionError):
                pass
        # what the request set off on the loop has had its turn, and the loop is alive (a hung loop makes this wait
        # past libFuzzer's -timeout, which reports the input as a hang)
        self._run(asyncio.sleep(0))
        if self.errors:
            raise InternalError(self.errors.pop(0))


def _read_answer(sock: socket.socket) -> None:
    """One response frame, or until the broker closes the connection."""
    received = b""
    while len(received) < 4 or len(received) < 4 + struct.unpack(">i", received[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            return
        received += chunk


@cache
def live_broker() -> LiveBroker:
    broker = LiveBroker()
    # only the files: stopping the broker could outlast libFuzzer's exit (its loop thread dies with the process)
    atexit.register(shutil.rmtree, broker.directory, True)
    return broker


def request_to_broker(frame: bytes) -> None:
    live_broker().send(frame)
