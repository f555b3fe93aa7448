"""One client connection: read frames, dispatch them in order, write responses in request order.

Each request runs its handler's ordered phase before the next request is read (so a connection's produce requests
reach their partitions in arrival order); whatever the handler still has to wait for (durability, a long-poll fetch,
a rebalance) continues as a task, and up to `max_in_flight` of those overlap. The writer sends their responses
strictly in request order, as the Kafka protocol requires.

Backpressure: the next request is read only when fewer than max.in.flight.requests.per.connection are unanswered and
the bytes of unanswered requests are below max.in.flight.bytes.per.connection (and, broker-wide,
queued.max.request.bytes); until then the socket is not read, so the client's TCP window closes. Nothing is dropped
or reordered. Between requests a connection may stay idle for connections.max.idle.ms; once a request's size is read,
its body must arrive within socket.request.read.timeout.ms, or that connection is closed.
"""
import asyncio
import functools
import inspect
import itertools
import logging
import time
from typing import TYPE_CHECKING

from kop.admin.metrics import RequestSeries
from kop.byte_budget import ByteBudget
from kop.handlers.context import BrokerServices, RequestContext
from kop.security.listeners import ListenerSpec
from kop.security.sasl import AuthenticationFailed
from kop.security.session import Session, SessionClosed
from kop.security.tls import subject_name
from protocol.api import (ProtocolError, UnsupportedVersion, decode_body, encode_response, parse_header,
                          response_class)
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kop.broker import Broker

log = logging.getLogger(__name__)

API_VERSIONS_KEY = 18
_ids = itertools.count(1)


class SlowRequest(Exception):
    """A request body did not arrive within socket.request.read.timeout.ms."""


class Connection:
    def __init__(self, broker: "Broker", listener: ListenerSpec, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.broker = broker
        self._services = BrokerServices.of(broker, listener)  # all a handler gets of the broker
        self.reader = reader
        self.writer = writer
        self.id = next(_ids)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._responses: asyncio.Queue = asyncio.Queue()
        config = broker.config
        self._slots = asyncio.Semaphore(max(1, config.max_in_flight_requests_per_connection))
        self._bytes = ByteBudget(config.max_in_flight_bytes_per_connection)
        self._idle_timeout = config.connections_max_idle_ms / 1000
        self._read_timeout = config.socket_request_read_timeout_ms / 1000
        self._quiet_until = 0.0  # time.monotonic(): a throttled client is not read before (KIP-219)
        self._paused_by: set[str] = set()  # the limits that have paused this connection, each logged once
        self._client_id: str | None = None  # of the last request, and the log fields naming it: kept, not rebuilt
        self.log_fields: dict[str, str] = {"client_id": "", "addr": self.peer}
        certificate = writer.get_extra_info("peercert")
        self.session = Session.start(listener, subject_name(certificate) if certificate else None)

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_responses())
        try:
            await self._read_requests()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass
        except (ProtocolError, SlowRequest, SessionClosed) as exc:
            log.warning("closing connection %s from %s: %s", self.id, self.peer, exc, extra=self.log_fields)
        except Exception:
            log.exception("closing connection %s from %s after an internal error", self.id, self.peer,
                          extra=self.log_fields)
        finally:
            self._responses.put_nowait(None)
            try:
                await asyncio.wait_for(writer_task, 30)
            except (asyncio.TimeoutError, Exception):
                writer_task.cancel()
            if self.session.close_after_response:  # the client reads the answer before it sees the close
                await asyncio.sleep(self.broker.config.connection_failed_authentication_delay_ms / 1000)
            self.writer.close()

    async def _read_requests(self) -> None:
        config = self.broker.config
        while True:
            if self._quiet_until:
                await asyncio.sleep(self._quiet_until - time.monotonic())
                self._quiet_until = 0.0
            size = int.from_bytes(await self._read(4, self._idle_timeout), "big", signed=True)
            max_size, key = ((config.sasl_server_max_receive_size, "sasl.server.max.receive.size before "
                              "authentication") if self.session.receiving_limit_applies
                             else (config.socket_request_max_bytes, "socket.request.max.bytes"))
            if size < 0 or size > max_size:
                raise ProtocolError(f"request size {size} outside 0..{max_size} ({key})")
            await self._slots.acquire()
            try:
                await self._reserve(size)
            except BaseException:
                self._slots.release()
                raise
            try:
                pending = await self._dispatch(await self._read_body(size))
            except BaseException:
                self._slots.release()
                self._unreserve(size)
                raise
            if pending is None or pending.done():  # answered in the ordered phase
                self._unreserve(size)
            else:
                pending.add_done_callback(functools.partial(self._answered, size))
            if pending is None:
                self._slots.release()
            else:
                self._responses.put_nowait(pending)
            if self.session.close_after_response:
                return  # the answer is sent, then the connection closes

    async def _read_body(self, size: int) -> bytes:
        try:
            return await self._read(size, self._read_timeout)
        except TimeoutError:
            raise SlowRequest(f"request body of {size} bytes not received within "
                              f"{self._read_timeout:g}s (socket.request.read.timeout.ms)") from None

    async def _read(self, size: int, timeout: float) -> bytes:
        """readexactly within `timeout`. Pipelined requests are usually buffered already and a timer costs about ten
        times such a read, so there is one only when we must wait (StreamReader has no public way to ask)."""
        if len(self.reader._buffer) >= size:
            return await self.reader.readexactly(size)
        async with asyncio.timeout(timeout):  # not wait_for: that makes a task
            return await self.reader.readexactly(size)

    async def _reserve(self, size: int) -> None:
        """Wait until this connection, then the broker, may hold `size` more bytes of requests."""
        await self._wait_for_budget(self._bytes, size, "max.in.flight.bytes.per.connection")
        try:
            await self._wait_for_budget(self.broker.request_bytes, size, "queued.max.request.bytes")
        except BaseException:
            self._bytes.release(size)
            raise

    async def _wait_for_budget(self, budget: ByteBudget, size: int, key: str) -> None:
        if budget.try_reserve(size):
            return
        if key not in self._paused_by:
            self._paused_by.add(key)
            log.info("connection %s from %s: reading paused while %d bytes of requests are unanswered (%s=%d)",
                     self.id, self.peer, budget.in_use, key, budget.limit, extra=self.log_fields)
        await budget.reserve(size)

    def _unreserve(self, size: int) -> None:
        self._bytes.release(size)
        self.broker.request_bytes.release(size)

    def _answered(self, size: int, _pending: asyncio.Future) -> None:
        self._unreserve(size)

    async def _dispatch(self, frame: bytes):
        """Run a request's ordered phase; returns an awaitable of the response frame, or None for no response."""
        if self.session.raw_tokens:
            return _done(await self._raw_token(frame))
        started = time.perf_counter()
        router = self.broker.api_router
        try:
            header, body_offset = parse_header(frame, router.versions)
        except UnsupportedVersion as exc:
            if exc.api_key == API_VERSIONS_KEY:
                return _done(self._api_versions_fallback(exc.correlation_id))
            raise ProtocolError(str(exc)) from None
        self.session.admit(header.api_key)
        request = decode_body(header, frame, body_offset)
        if header.client_id != self._client_id:
            self._client_id = header.client_id
            self.log_fields = {"client_id": header.client_id or "", "addr": self.peer}
        ctx = RequestContext(self._services, header, self.peer, self.id, self.log_fields, self.session)
        series = self.broker.metrics.request_series(header.api_key)
        result = await router.routes[header.api_key].handler(ctx, request)
        if result is None:
            series.answered(started, None)
            return None
        if inspect.isawaitable(result):
            return asyncio.ensure_future(self._encode_later(result, header.correlation_id, series, started))
        self._throttled(result)
        series.answered(started, result)
        return _done(encode_response(result, header.correlation_id))

    async def _encode_later(self, awaitable, correlation_id: int, series: RequestSeries,
                            started: float) -> bytes | None:
        response = await awaitable
        self._throttled(response)
        series.answered(started, response)
        return None if response is None else encode_response(response, correlation_id)

    def _throttled(self, response) -> None:
        """A response that tells the client to wait (a quota) also keeps the broker from reading it meanwhile."""
        throttle_ms = getattr(response, "throttle_time_ms", 0)
        if throttle_ms:
            self._quiet_until = max(self._quiet_until, time.monotonic() + throttle_ms / 1000)

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

    async def _write_responses(self) -> None:
        while True:
            pending = await self._responses.get()
            if pending is None:
                return
            try:
                data = await pending
            except Exception:
                log.exception("request on connection %s from %s failed; closing", self.id, self.peer,
                              extra=self.log_fields)
                self.writer.close()
                return
            finally:
                self._slots.release()
            if data is not None:
                self.writer.write(data)
                await self.writer.drain()


def _done(data: bytes) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(data)
    return future
