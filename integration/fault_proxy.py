"""A Kafka-aware TCP proxy that loses Produce responses: the batch is stored, the client never hears so, and retries.

Clients connect to the proxy (the broker advertises the proxy's port: `advertised.port`); each client connection gets
its own connection to the broker. The proxy reads whole frames both ways (4-byte size, then the body). Requests
carry api key, version and correlation id in their header; a broker answers one connection's requests in request
order, so responses are matched to requests first-in first-out (and the correlation id of each response is checked
against that order: a mismatch is counted as an order violation, a broker bug).

The fault: when a request picked by the CutPolicy (Produce requests by default, or requests of any API) has been
forwarded and its response arrives, the response is dropped and both sockets of that connection are closed.
Responses of requests pipelined behind it are lost too, as they would be on a real dropped connection. Produce
requests with acks=0 get no response and are never picked.
`hold_responses(True)` keeps every response from reaching its client until released; `drop_held()` then closes the
connections holding one, as a broker killed with its answers unsent would: the batches are stored and the clients
never heard so (a kill between the fsync and the ack, made certain). `delay_produce(True)` holds Produce requests
back instead, as a network that stalls: the connection that sent one hears nothing more (what follows the request on
it is dropped) until its client gives up on it; `deliver_delayed()` hands the held requests to the broker later, as
the network finally would, and returns the broker's answers.

Everything runs on an asyncio loop in one background thread; `start()` and `stop()` are bounded in time.
"""
from __future__ import annotations

import asyncio
import struct
import threading
from collections import Counter, deque
from dataclasses import dataclass, field

from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from integration.idem_raw import RawKafka
from protocol.errors import ErrorCode
from protocol.records import split_batches

PRODUCE = 0
FIRST_FLEXIBLE_PRODUCE_VERSION = 9
MAX_FRAME = 128 * 1024 * 1024
CONNECT_TIMEOUT = 5.0
_FIXED_HEADER = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class CutPolicy:
    """Cut the response of every `every`-th request of the APIs in `apis` (None: every API), after the first
    `skip_first`, at most `max_cuts` times.

    Those requests are numbered from 1 across all connections, in the order the proxy forwards them.
    """

    every: int = 10
    max_cuts: int = 10
    skip_first: int = 0
    apis: frozenset[int] | None = frozenset({PRODUCE})

    def covers(self, api_key: int) -> bool:
        return self.apis is None or api_key in self.apis

    def __post_init__(self) -> None:
        if self.every < 1 or self.max_cuts < 0 or self.skip_first < 0:
            raise ValueError(f"bad cut policy {self}")

    def picks(self, produce_number: int, cuts_planned: int) -> bool:
        n = produce_number - self.skip_first
        return n > 0 and n % self.every == 0 and cuts_planned < self.max_cuts


@dataclass(frozen=True, slots=True)
class ProxyStats:
    connections: int
    requests: int
    produce_requests: int
    cuts: int
    order_violations: int
    cuts_by_api: dict[int, int] = field(default_factory=dict)  # api key -> responses cut
    # error code -> partition responses that reached the client with it (cut responses are not counted)
    produce_errors: dict[int, int] = field(default_factory=dict)
    # the batches answered DUPLICATE_SEQUENCE_NUMBER (stored before; clients report them with no or a made-up offset)
    duplicate_sequence_batches: tuple[BatchIdentity, ...] = ()
    severed: int = 0  # connections closed or refused while the link was severed


@dataclass(frozen=True, slots=True)
class BatchIdentity:
    """The idempotence header fields of one batch of a Produce request."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int


@dataclass(frozen=True, slots=True)
class _RequestInfo:
    api_key: int
    api_version: int
    correlation_id: int
    expects_response: bool


@dataclass(slots=True)
class _Pending:
    info: _RequestInfo
    cut: bool
    batches: dict[tuple[str, int], BatchIdentity] = field(default_factory=dict)  # Produce only


def parse_request_header(body: bytes) -> _RequestInfo:
    """Header fields, and whether a response will come (not for Produce with acks=0)."""
    if len(body) < _FIXED_HEADER.size:
        raise ValueError(f"request of {len(body)} bytes is shorter than a header")
    api_key, version, correlation_id, client_id_len = _FIXED_HEADER.unpack_from(body)
    expects_response = True
    if api_key == PRODUCE:
        expects_response = _produce_acks(body, version, _FIXED_HEADER.size + max(client_id_len, 0)) != 0
    return _RequestInfo(api_key, version, correlation_id, expects_response)


def _produce_acks(body: bytes, version: int, pos: int) -> int:
    flexible = version >= FIRST_FLEXIBLE_PRODUCE_VERSION
    if flexible:  # request header v2: tagged fields after the client id
        count, pos = _uvarint(body, pos)
        for _ in range(count):
            _, pos = _uvarint(body, pos)
            size, pos = _uvarint(body, pos)
            pos += size
    if version >= 3:  # transactional id before acks
        if flexible:
            length, pos = _uvarint(body, pos)
            pos += max(length - 1, 0)
        else:
            (length,) = _INT16.unpack_from(body, pos)
            pos += 2 + max(length, 0)
    return _INT16.unpack_from(body, pos)[0]


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(5):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint too long")


def produce_error_codes(body: bytes, version: int) -> list[tuple[str, int, int]]:
    """(topic, partition, error code) of every partition in a Produce response (body = the frame without its size)."""
    response = ProduceResponse.decode(body, version=version, header=True)
    return [(t.name, p.index, p.error_code) for t in response.responses for p in t.partition_responses]


def produce_batches(body: bytes, version: int) -> dict[tuple[str, int], BatchIdentity]:
    """The idempotent batch of each partition of a Produce request (one batch per partition since v3)."""
    request = ProduceRequest.decode(body, version=version, header=True)
    out = {}
    for topic in request.topic_data:
        for partition in topic.partition_data:
            for header, _ in split_batches(partition.records or b""):
                if header.producer_id >= 0:
                    out[(topic.name, partition.index)] = BatchIdentity(
                        topic.name, partition.index, header.producer_id, header.producer_epoch,
                        header.base_sequence, header.base_sequence + header.last_offset_delta)
    return out


class FaultProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<upstream_port>, cutting Produce responses as the policy says.

    `upstream_port` may be set after start() (the broker needs the proxy's port before it starts) and changed at any
    time; it is read for each new client connection.
    """

    def __init__(self, upstream_port: int = 0, policy: CutPolicy | None = None) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._policy = policy
        self._lock = threading.Lock()
        self._connections = self._requests = self._produce_requests = self._candidates = 0
        self._cuts_by_api: Counter[int] = Counter()
        self._cuts = self._cuts_planned = self._order_violations = 0
        self._produce_errors: Counter[int] = Counter()
        self._duplicate_sequence_batches: list[BatchIdentity] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._released: asyncio.Event | None = None  # cleared while responses are held
        self._held = 0  # Produce responses the broker sent that are being held
        self._holding: set[asyncio.Task] = set()  # connections (their handler tasks) holding a response
        self._handlers: set[asyncio.Task] = set()
        self._error: BaseException | None = None
        self._delaying = False
        self._delayed: list[tuple[_RequestInfo, bytes]] = []  # Produce requests held back, in arrival order
        self._severed = False
        self._severed_count = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_policy(self, policy: CutPolicy | None) -> None:
        """Replace the policy (None: forward everything); the count of cuts planned so far starts again."""
        with self._lock:
            self._policy = policy
            self._cuts_planned = 0

    def hold_responses(self, hold: bool) -> None:
        """Hold every response from now on (True), or let them through again (False)."""
        if self._released is None:
            raise RuntimeError("the proxy is not running")
        self._on_loop(self._released.clear if hold else self._released.set, "switch")

    def drop_held(self) -> None:
        """Close every connection that holds a response, both ways: the response is lost."""
        self._on_loop(lambda: self._cancel(self._holding), "drop its held responses")

    def sever(self, severed: bool) -> None:
        """Close every connection and refuse new ones from now on (True), as a network link that went down; or
        accept connections again (False)."""
        with self._lock:
            self._severed = severed
        if severed:
            self._on_loop(lambda: self._cancel(self._handlers, counted=True), "sever its connections")

    def _cancel(self, handlers: set[asyncio.Task], counted: bool = False) -> None:
        """Close those connections (their handlers close both sockets); counted: as severed."""
        with self._lock:
            self._severed_count += len(handlers) if counted else 0
        for handler in list(handlers):
            handler.cancel()

    def _on_loop(self, action, what: str) -> None:
        """Run `action` on the proxy's loop and wait until it has run."""
        if self._loop is None:
            raise RuntimeError("the proxy is not running")
        done = threading.Event()

        def run() -> None:
            action()
            done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(5):
            raise RuntimeError(f"the proxy did not {what}")

    def delay_produce(self, delay: bool) -> None:
        """Hold every Produce request from now on instead of forwarding it (True), or forward them again (False)."""
        with self._lock:
            self._delaying = delay

    def delayed_requests(self) -> int:
        """Produce requests held back and not delivered yet."""
        with self._lock:
            return len(self._delayed)

    def deliver_delayed(self, timeout: float = 10.0) -> list[tuple[str, int, int]]:
        """Stop holding Produce requests and send the held ones to the broker now, one after the other on a
        connection of their own; (topic, partition, error code) of each partition the broker answered."""
        with self._lock:
            self._delaying = False
            delayed, self._delayed = self._delayed, []
        answers = []
        with RawKafka(self.upstream_port, timeout=timeout) as kafka:
            for info, frame in delayed:
                kafka.send_frame(frame)
                response = kafka.receive(info.correlation_id, ProduceResponse, info.api_version)
                answers += [(t.name, p.index, p.error_code) for t in response.responses for p in t.partition_responses]
        return answers

    def held_responses(self) -> int:
        """Produce responses the broker has sent that the proxy holds back now."""
        with self._lock:
            return self._held

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(self._connections, self._requests, self._produce_requests, self._cuts,
                              self._order_violations, dict(self._cuts_by_api), dict(self._produce_errors),
                              tuple(self._duplicate_sequence_batches), self._severed_count)

    # ---- lifecycle

    def start(self, timeout: float = 10.0) -> "FaultProxy":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or not self.port:
            raise RuntimeError(f"fault proxy did not start: {self._error!r}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stopping is not None and self._thread is not None:
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:  # loop already closed
                pass
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("fault proxy thread did not stop")

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(ready))
        except BaseException as exc:  # reported by start() if it happens before ready
            self._error = exc
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._released = asyncio.Event()
        self._released.set()
        server = await asyncio.start_server(self._on_client, "127.0.0.1", self.port or 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            await self._stopping.wait()
            server.close()
            for task in list(self._handlers):
                task.cancel()
            if self._handlers:
                await asyncio.wait(self._handlers, timeout=5)

    # ---- one client connection

    async def _on_client(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        with self._lock:
            severed = self._severed
            self._severed_count += severed
            self._connections += 1
        if severed:
            client_writer.close()
            return
        self._handlers.add(task)
        upstream_writer = None
        pending: deque[_Pending] = deque()
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream_port), CONNECT_TIMEOUT)
            pumps = [asyncio.create_task(self._pump_requests(client_reader, upstream_writer, pending)),
                     asyncio.create_task(self._pump_responses(upstream_reader, client_writer, pending, task))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                pass  # drop_held: the connection closes below
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (OSError, asyncio.TimeoutError):
            pass  # broker down or gone: the client sees its connection close
        finally:
            with self._lock:  # planned cuts that never happened go back to the budget
                self._cuts_planned -= sum(1 for p in pending if p.cut)
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
            self._handlers.discard(task)
            self._holding.discard(task)

    async def _pump_requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             pending: deque[_Pending]) -> None:
        while True:
            frame = await _read_frame(reader)
            if frame is None:
                return
            info = parse_request_header(frame[4:])
            cut = False
            with self._lock:
                delayed = self._delaying and info.api_key == PRODUCE and info.expects_response
                if delayed:
                    self._delayed.append((info, frame))
            if delayed:  # the connection stalls: nothing more reaches the broker, nor any answer the client
                while await _read_frame(reader) is not None:
                    pass
                return
            with self._lock:
                self._requests += 1
                self._produce_requests += info.api_key == PRODUCE and info.expects_response
                if info.expects_response and self._policy is not None and self._policy.covers(info.api_key):
                    self._candidates += 1
                    if self._policy.picks(self._candidates, self._cuts_planned):
                        cut = True
                        self._cuts_planned += 1
            if info.expects_response:
                try:
                    batches = produce_batches(frame[4:], info.api_version) if info.api_key == PRODUCE else {}
                except Exception:  # noqa: BLE001 - forwarded all the same; the broker judges the request
                    batches = {}
                pending.append(_Pending(info, cut, batches))  # before forwarding: the response may come at once
            writer.write(frame)
            await writer.drain()

    async def _pump_responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              pending: deque[_Pending], handler: asyncio.Task) -> None:
        while True:
            frame = await _read_frame(reader)
            if frame is None:
                return
            if not pending:
                raise ConnectionError("a response without a request")
            request = pending.popleft()
            if not self._released.is_set():  # held: lost if drop_held closes the connection meanwhile
                produce = request.info.api_key == PRODUCE
                with self._lock:
                    self._held += produce
                self._holding.add(handler)
                try:
                    await self._released.wait()
                finally:
                    self._holding.discard(handler)
                    with self._lock:
                        self._held -= produce
            correlation_id = _INT32.unpack_from(frame, 4)[0]
            if request.cut:
                with self._lock:
                    self._cuts += 1
                    self._cuts_by_api[request.info.api_key] += 1
                return  # the caller closes both sockets; this response is never delivered
            with self._lock:
                if correlation_id != request.info.correlation_id:
                    self._order_violations += 1
                if request.info.api_key == PRODUCE:
                    try:
                        answers = produce_error_codes(frame[4:], request.info.api_version)
                    except Exception:  # noqa: BLE001 - an undecodable response is counted, not fatal
                        answers = [("", -1, -1)]
                    for topic, partition, code in answers:
                        self._produce_errors[code] += 1
                        if code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and (topic, partition) in request.batches:
                            self._duplicate_sequence_batches.append(request.batches[(topic, partition)])
            writer.write(frame)
            await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One whole frame including its size prefix; None at a clean end of stream."""
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError:
        return None
    (size,) = _INT32.unpack(prefix)
    if not 8 <= size <= MAX_FRAME:
        raise ConnectionError(f"absurd frame size {size}")
    try:
        return prefix + await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None
