"""One client connection: frames read into a preallocated buffer, each request's ordered phase run in arrival order,
responses written in request order.

The connection is an asyncio BufferedProtocol: the transport reads straight into this connection's buffer and every
whole frame in it is handled in the same callback, with no stream reader, task or queue per request. A request's
ordered phase (its handler up to the point where it returns) runs before the next request is handled, so a
connection's produce requests reach their partitions in arrival order. Handlers that are plain functions (Produce)
run inline; coroutine handlers run as a task from their first step (eagerly, where Python has eager tasks: a step
that never waits then completes in the same callback), and the connection handles nothing more until it returns.
Never outside a task: what a handler calls may need one (asyncio.timeout, and wait_for since Python 3.12; asyncpg's
connect when its pool opens a connection). Whatever a
handler still waits for (durability, a long-poll fetch, a rebalance) completes later; up to `max_in_flight` such
requests overlap, and the responses that are ready go out in request order, those of one loop iteration in one
`writelines`.

Backpressure: a request's size is read, then its bytes are reserved (max.in.flight.requests.per.connection,
max.in.flight.bytes.per.connection and, broker-wide, queued.max.request.bytes) before its body is taken; while a
reservation waits, or an ordered phase runs, the socket is not read, so the client's TCP window closes. Nothing is
dropped or reordered. Between requests a connection may stay idle for connections.max.idle.ms; once a request's size
is read, its body must arrive within socket.request.read.timeout.ms, or that connection is closed. One timer per
connection watches both.
"""
import asyncio
import functools
import inspect
import itertools
import logging
import struct
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

from kop.admin.metrics import RequestSeries
from kop.byte_budget import ByteBudget
from kop.handlers.context import BrokerServices, RequestContext
from kop.handlers.registry import Deferred
from kop.security.listeners import ListenerSpec
from kop.security.sasl import AuthenticationFailed
from kop.security.session import Session, SessionClosed
from kop.security.tls import subject_name
from protocol.api import (ProtocolError, UnsupportedVersion, decode_body, encode_response, parse_header,
                          response_class)
from protocol.errors import ErrorCode

try:  # a request's own buffer need not be zeroed: every byte of it is read from the socket before it is used
    from protocol._accel import uninitialized as _request_buffer
except ImportError:  # built without a C compiler
    _request_buffer = bytearray

if TYPE_CHECKING:
    from kop.broker import Broker

log = logging.getLogger(__name__)

API_VERSIONS_KEY = 18
_ids = itertools.count(1)
_SIZE = struct.Struct(">i")
BUFFER_BYTES = 16 * 1024  # a connection's read buffer to begin with; it grows to hold a whole frame
MIN_READ_BYTES = 4 * 1024  # room offered to each read at least
PRODUCE_KEY = 0
# A larger frame whose body has yet to arrive is read straight into a buffer of its own, which becomes the request's
# bytes: a produce request's records are validated and written from it without a copy.
OWN_BUFFER_BYTES = BUFFER_BYTES
DRAIN_SECONDS = 30  # a closing connection waits this long at most for the answers it still owes


def _is_produce(frame: bytearray | memoryview) -> bool:
    """Whether the request's api key (int16, big-endian) is Produce's."""
    return len(frame) >= 2 and frame[0] == 0 and frame[1] == PRODUCE_KEY


class SlowRequest(Exception):
    """A request body did not arrive within socket.request.read.timeout.ms."""


class _Response:
    """One request's place in the connection's answer order."""

    __slots__ = ("correlation_id", "size", "started", "series", "data", "ready")

    def __init__(self, correlation_id: int, size: int, started: float, series: RequestSeries | None) -> None:
        self.correlation_id = correlation_id
        self.size = size  # bytes reserved for the request, given back once it is answered
        self.started = started
        self.series = series
        self.data: bytes | list | None = None  # the framed response, or its parts; None: no response (acks=0)
        self.ready = False


# Python 3.12's eager tasks run a coroutine's first step in the task at once: most ordered phases never wait, and
# complete there (Fetch, Metadata, group heartbeats). Before 3.12 the task's first step runs at the next iteration.
_EAGER = {"eager_start": True} if sys.version_info >= (3, 12) else {}


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker: "Broker", listener: ListenerSpec) -> None:
        self.broker = broker
        self.listener = listener
        self.id = next(_ids)
        self.peer = ""
        self.transport: asyncio.Transport | None = None
        config = broker.config
        self._max_in_flight = max(1, config.max_in_flight_requests_per_connection)
        self._bytes = ByteBudget(config.max_in_flight_bytes_per_connection)
        self._idle_timeout = config.connections_max_idle_ms / 1000
        self._read_timeout = config.socket_request_read_timeout_ms / 1000
        self._buf = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0  # unhandled bytes are _buf[_start:_end]
        self._end = 0
        self._size = -1  # of the frame whose size is read (-1: none)
        self._own: bytearray | None = None  # that frame's body when it is read into a buffer of its own
        self._own_filled = 0  # bytes of it received
        self._reserved = False  # that frame's bytes and in-flight place are reserved
        self._frame_started = 0.0  # loop time its reservation was granted: its body must follow in time
        self._last_read = 0.0  # loop time of the last bytes received
        self._in_flight = 0  # requests reserved and not yet answered on the wire
        self._responses: deque[_Response] = deque()  # in request order
        self._hold: str | None = None  # why frames are not handled now (an ordered phase, a reservation, ...)
        self._paused = False  # the transport's reading is paused
        self._flush_soon = False
        self._closing = False  # no more requests are handled: answers owed are written, then it closes
        self._closed = False
        self._closing_later = False  # closing after a failed authentication's delay
        self._timer: asyncio.TimerHandle | None = None
        self._quiet_until = 0.0  # time.monotonic(): a throttled client is not read before (KIP-219)
        self._paused_by: set[str] = set()  # the limits that have paused this connection, each logged once
        self._client_id: str | None = None  # of the last request, and the log fields naming it: kept, not rebuilt
        self.log_fields: dict[str, str] = {"client_id": "", "addr": ""}
        self.session: Session | None = None
        self._services: BrokerServices | None = None
        self._tasks: set[asyncio.Future] = set()  # ordered phases and reservations under way
        self._ordered: asyncio.Future | None = None  # the ordered phase under way
        self._loop = asyncio.get_running_loop()

    # ---- the transport's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.log_fields = {"client_id": "", "addr": self.peer}
        if not self.broker.admit_connection(self, peer[0] if isinstance(peer, tuple) else str(peer)):
            self._closed = True
            transport.close()
            return
        self._services = BrokerServices.of(self.broker, self.listener)  # all a handler gets of the broker
        certificate = transport.get_extra_info("peercert")
        self.session = Session.start(self.listener, subject_name(certificate) if certificate else None)
        self._last_read = self._loop.time()
        self._timer = self._loop.call_at(self._last_read + self._idle_timeout, self._on_timer)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._own is not None:  # the rest of that frame, and nothing after it
            return memoryview(self._own)[self._own_filled:]
        wanted = MIN_READ_BYTES
        if self._size >= 0:  # room for the rest of the frame in one read
            wanted = max(wanted, 4 + self._size - (self._end - self._start))
        if len(self._buf) - self._end < wanted:
            self._make_room(wanted)
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._own is not None:
            self._own_filled += nbytes
        else:
            self._end += nbytes
        self._last_read = self._loop.time()
        if self._hold is not None or self._closing:
            self._pause()
            return
        self._handle_frames()

    def eof_received(self) -> bool:
        """The client sent everything: answer what it asked, then close (a half-closed client still reads)."""
        self._close_when_answered()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        for task in [t for t in self._tasks if t is not self._ordered]:  # an ordered phase under way completes
            task.cancel()
        if self._reserved:  # a frame reserved but never handled
            self._unreserve(self._size)
            self._reserved = False
        self.broker.forget_connection(self)

    def abort(self) -> None:
        """Close at once, and stop the ordered phase under way (the broker stops)."""
        for task in self._tasks:
            task.cancel()
        if self.transport is not None:
            self.transport.abort()

    # ---- reading frames

    def _make_room(self, wanted: int) -> None:
        """Move the unhandled bytes to the front of the buffer, or into a larger one, so `wanted` bytes fit after
        them; a buffer grown for a large frame goes back to the usual size once it is empty."""
        held = self._end - self._start
        size = len(self._buf)
        if held + wanted > size or (held == 0 and size > 4 * BUFFER_BYTES and wanted <= BUFFER_BYTES):
            new = bytearray(max(BUFFER_BYTES, held + wanted, min(2 * size, held + wanted + size)) if held + wanted
                            > size else BUFFER_BYTES)
            new[:held] = self._view[self._start:self._end]
            self._buf, self._view = new, memoryview(new)
        elif held:
            self._buf[:held] = self._view[self._start:self._end]
        self._start, self._end = 0, held

    def _handle_frames(self) -> None:
        """Handle every whole frame buffered, until one must wait."""
        buf = self._buf
        while self._hold is None and not self._closing:
            if self._size < 0:
                if self._end - self._start < 4:
                    break
                if self._quiet_until and self._stay_quiet():
                    break
                if not self._read_size(_SIZE.unpack_from(buf, self._start)[0]):
                    return
            if not self._reserved:
                if not self._reserve(self._size):
                    break
                self._reserved = True
                self._frame_started = self._loop.time()
            if self._own is not None:
                if self._own_filled < self._size:  # the body has yet to arrive: the timer watches its read timeout
                    self._watch_body()
                    break
                frame, self._own = self._own, None
                size, self._size, self._reserved = self._size, -1, False
                self._dispatch(frame if _is_produce(frame) else bytes(frame), size)
                continue
            end = self._start + 4 + self._size
            if end > self._end:  # the body has yet to arrive: the timer watches its read timeout
                if self._size > OWN_BUFFER_BYTES:
                    self._read_into_own_buffer()
                self._watch_body()
                break
            body = self._view[self._start + 4:end]
            # A produce request's bytes are its own and writable: its batches get their offsets in place
            frame = bytearray(body) if _is_produce(body) else bytes(body)
            size, self._start, self._size, self._reserved = self._size, end, -1, False
            if self._start == self._end:
                self._start = self._end = 0
            self._dispatch(frame, size)
            buf = self._buf
        self._flush()

    def _read_into_own_buffer(self) -> None:
        """The frame whose size is read goes on into a buffer of its own, with what has arrived of it."""
        body = self._start + 4
        own = _request_buffer(self._size)
        held = self._end - body
        own[:held] = self._view[body:self._end]
        self._own, self._own_filled = own, held
        self._start = self._end = 0

    def _read_size(self, size: int) -> bool:
        config = self.broker.config
        max_size, key = ((config.sasl_server_max_receive_size, "sasl.server.max.receive.size before "
                          "authentication") if self.session.receiving_limit_applies
                         else (config.socket_request_max_bytes, "socket.request.max.bytes"))
        if size < 0 or size > max_size:
            self._fail(ProtocolError(f"request size {size} outside 0..{max_size} ({key})"))
            return False
        self._size = size
        return True

    def _reserve(self, size: int) -> bool:
        """Reserve an in-flight place and `size` bytes for the next request; False (with a hold) if it must wait."""
        if self._in_flight >= self._max_in_flight:
            self._hold = "max.in.flight.requests.per.connection"  # lifted when an answer is written
            return False
        if not self._bytes.try_reserve(size):
            self._wait_for_budget(self._bytes, size, "max.in.flight.bytes.per.connection")
            return False
        if not self.broker.request_bytes.try_reserve(size):
            self._bytes.release(size)
            self._wait_for_budget(self.broker.request_bytes, size, "queued.max.request.bytes")
            return False
        self._in_flight += 1
        return True

    def _wait_for_budget(self, budget: ByteBudget, size: int, key: str) -> None:
        """Wait for the budget in a task; once granted, the reservation starts again from the in-flight place."""
        if key not in self._paused_by:
            self._paused_by.add(key)
            log.info("connection %s from %s: reading paused while %d bytes of requests are unanswered (%s=%d)",
                     self.id, self.peer, budget.in_use, key, budget.limit, extra=self.log_fields)
        self._hold = key
        self._pause()
        task = asyncio.ensure_future(budget.reserve(size))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._budget_granted, budget, size))

    def _budget_granted(self, budget: ByteBudget, size: int, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        budget.release(size)  # granted in turn; reserved again below, with the other limits, all at once
        self._release_hold()

    def _watch_body(self) -> None:
        deadline = self._frame_started + self._read_timeout
        if self._timer is not None and self._timer.when() > deadline:
            self._timer.cancel()
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = self._loop.time()
        if self._reserved and not self._closing:
            deadline = self._frame_started + self._read_timeout
            if now >= deadline:
                self._fail(SlowRequest(f"request body of {self._size} bytes not received within "
                                       f"{self._read_timeout:g}s (socket.request.read.timeout.ms)"))
                return
        else:
            deadline = self._last_read + self._idle_timeout
            if now >= deadline and self._start == self._end and self._hold is None:
                self._close_when_answered()  # idle: connections.max.idle.ms
                return
        self._timer = self._loop.call_at(deadline, self._on_timer)

    def _pause(self) -> None:
        if not self._paused and not self._closed:
            self._paused = True
            self.transport.pause_reading()

    def _release_hold(self) -> None:
        self._hold = None
        if self._closing:
            return
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        self._handle_frames()

    # ---- handling a request

    def _dispatch(self, frame: bytes, size: int) -> None:
        """Run a request's ordered phase (inline, or as a task the connection waits for) and give its answer its
        place in the response order."""
        if self.session.raw_tokens:
            return self._raw_token_phase(frame, size)
        started = time.perf_counter()
        router = self.broker.api_router
        try:
            header, body_offset = parse_header(frame, router.versions)
        except UnsupportedVersion as exc:
            if exc.api_key == API_VERSIONS_KEY:
                return self._answer_now(self._api_versions_fallback(exc.correlation_id), size)
            return self._fail(ProtocolError(str(exc)), size)
        except ProtocolError as exc:
            return self._fail(exc, size)
        try:
            self.session.admit(header.api_key)
            request = decode_body(header, frame, body_offset)
        except (ProtocolError, SessionClosed) as exc:
            return self._fail(exc, size)
        if header.client_id != self._client_id:
            self._client_id = header.client_id
            self.log_fields = {"client_id": header.client_id or "", "addr": self.peer}
        ctx = RequestContext(self._services, header, self.peer, self.id, self.log_fields, self.session)
        response = _Response(header.correlation_id, size, started, self.broker.metrics.request_series(header.api_key))
        self._responses.append(response)
        route = router.routes[header.api_key]
        try:
            if route.is_async:
                task = asyncio.Task(route.handler(ctx, request), **_EAGER)
                if task.done():  # eagerly, without waiting
                    result = task.result()
                else:  # the connection handles nothing more until it returns
                    self._ordered = task
                    self._tasks.add(task)
                    self._hold = "ordered phase"
                    task.add_done_callback(functools.partial(self._ordered_phase_done, response))
                    return
            else:
                result = route.handler(ctx, request)
        except Exception as exc:
            self._drop(response)
            return self._fail(exc)
        self._answer(response, result)
        if self.session.close_after_response:
            self._close_when_answered()

    def _ordered_phase_done(self, response: _Response, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        self._ordered = None
        if task.cancelled():
            self._drop(response)
            return
        exc = task.exception()
        if exc is not None:
            self._drop(response)
            self._fail(exc)
            return
        self._answer(response, task.result())
        if self.session.close_after_response:
            self._close_when_answered()
        self._release_hold()

    def _answer(self, response: _Response, result) -> None:
        """A handler's result: the response, an awaitable of it, or None (no response)."""
        if result is None:
            self._complete(response, None)
        elif isinstance(result, Deferred):
            result.future.add_done_callback(functools.partial(self._awaited, response, result.build))
        elif isinstance(result, asyncio.Future):
            result.add_done_callback(functools.partial(self._awaited, response, None))
        elif inspect.isawaitable(result):
            asyncio.ensure_future(result).add_done_callback(functools.partial(self._awaited, response, None))
        else:
            self._complete(response, result)

    def _awaited(self, response: _Response, build, future: asyncio.Future) -> None:
        """An awaited answer is done: `future` holds the response, or (a Deferred one) `build()` makes it."""
        if future.cancelled():  # the broker is stopping (a long poll cancelled): not a failed request
            log.debug("request on connection %s from %s cancelled; closing", self.id, self.peer)
            self._drop(response)
            return self._fail(None)
        try:
            result = future.result()
            if build is not None:
                result = build()
        except BaseException as exc:
            log.error("request on connection %s from %s failed; closing", self.id, self.peer,
                      exc_info=exc, extra=self.log_fields)
            self._drop(response)
            return self._fail(None)
        self._complete(response, result)
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self._flush)  # the answers completed in this iteration, in one write

    def _complete(self, response: _Response, result) -> None:
        response.ready = True
        self._unreserve(response.size)
        response.series.answered(response.started, result)
        if result is not None:
            self._throttled(result)
            response.data = encode_response(result, response.correlation_id)

    def _drop(self, response: _Response) -> None:
        """A request that gets no answer after all: the connection closes."""
        response.ready = True
        self._unreserve(response.size)

    def _answer_now(self, data: bytes, size: int) -> None:
        """An answer that needs no handler (a SASL token, the ApiVersions fallback)."""
        response = _Response(0, size, 0.0, None)
        response.data = data
        response.ready = True
        self._unreserve(size)
        self._responses.append(response)
        if self.session.close_after_response:
            self._close_when_answered()

    def _unreserve(self, size: int) -> None:
        self._bytes.release(size)
        self.broker.request_bytes.release(size)

    def _throttled(self, response) -> None:
        """A response that tells the client to wait (a quota) also keeps the broker from reading it meanwhile."""
        throttle_ms = getattr(response, "throttle_time_ms", 0)
        if throttle_ms:
            self._quiet_until = max(self._quiet_until, time.monotonic() + throttle_ms / 1000)

    # ---- writing answers

    def _flush(self) -> None:
        """Write the answers that are ready, in request order, in one call."""
        self._flush_soon = False
        responses = self._responses
        if responses and responses[0].ready:
            out = []
            written = 0
            while responses and responses[0].ready:
                data = responses.popleft().data
                written += 1
                if type(data) is list:
                    out.extend(data)
                elif data is not None:
                    out.append(data)
            self._in_flight -= written
            if out and not self._closed:
                self.transport.writelines(out)
            if self._hold == "max.in.flight.requests.per.connection" and not self._closing:
                self._release_hold()
        if self._closing and not responses:
            self._close()

    def _stay_quiet(self) -> bool:
        """A throttled client's next request waits until its throttle time has passed: True (with a hold) if so."""
        wait = self._quiet_until - time.monotonic()
        if wait <= 0:
            self._quiet_until = 0.0
            return False
        self._hold = "throttled"
        self._pause()
        self._loop.call_later(wait, self._quiet_over)
        return True

    def _quiet_over(self) -> None:
        self._quiet_until = 0.0
        if self._hold == "throttled":
            self._release_hold()

    # ---- closing

    def _fail(self, exc: BaseException | None, unanswered: int = -1) -> None:
        """Close this connection after what it still owes is answered: bad input, or an internal error.
        `unanswered`: the size of a request handled that gets no answer (its reservation is given back)."""
        if unanswered >= 0:
            self._in_flight -= 1
            self._unreserve(unanswered)
        if isinstance(exc, (ProtocolError, SlowRequest, SessionClosed)):
            log.warning("closing connection %s from %s: %s", self.id, self.peer, exc, extra=self.log_fields)
        elif exc is not None:
            log.error("closing connection %s from %s after an internal error", self.id, self.peer, exc_info=exc,
                      extra=self.log_fields)
        self._close_when_answered()

    def _close_when_answered(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._pause()
        self._flush()
        if self._responses:
            self._loop.call_later(DRAIN_SECONDS, self._close)

    def _close(self) -> None:
        if self._closed or self._closing_later:
            return
        if self.session is not None and self.session.close_after_response:
            # the client reads the answer before it sees the close
            self._closing_later = True
            self._loop.call_later(self.broker.config.connection_failed_authentication_delay_ms / 1000,
                                  self._close_now)
            return
        self._close_now()

    def _close_now(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.close()

    # ---- answers without a handler

    def _raw_token_phase(self, frame: bytes, size: int) -> None:
        """A bare SASL token is an ordered phase of its own, run as a task: a key derived from a password is
        derived in a worker thread (Session.advance)."""
        task = self._ordered = asyncio.ensure_future(self._raw_token(frame))
        self._tasks.add(task)
        self._hold = "ordered phase"
        task.add_done_callback(functools.partial(self._raw_token_done, size))

    def _raw_token_done(self, size: int, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        self._ordered = None
        if task.cancelled():
            self._unreserve(size)
            return
        exc = task.exception()
        if exc is not None:
            return self._fail(exc, size)
        self._answer_now(task.result(), size)
        self._release_hold()

    async def _raw_token(self, token: bytes) -> bytes:
        """A SASL token sent bare after SaslHandshake v0; the answer goes back bare too (size, then bytes). There is
        no field for an error: a failure closes the connection."""
        try:
            step = await self.session.advance(token, self.broker.config.connections_max_reauth_ms)
        except AuthenticationFailed as exc:
            raise SessionClosed(f"SASL authentication failed: {exc}") from None
        return len(step.challenge).to_bytes(4, "big") + step.challenge

    def _api_versions_fallback(self, correlation_id: int) -> bytes:
        """UNSUPPORTED_VERSION with a v0 body listing what we serve; clients retry with a version from it."""
        cls = response_class(API_VERSIONS_KEY, 0)
        keys = [cls.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(self.broker.api_router.versions.items())]
        return encode_response(cls(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=keys), correlation_id)
