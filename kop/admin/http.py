"""A small HTTP/1.1 server on asyncio streams, enough for a JSON admin API.

Requests carry a Content-Length body or none (chunked uploads are refused with 411); connections are kept alive as
HTTP/1.1 says unless the client asks otherwise. Every limit is explicit (head size, header count, body size, idle
time), and whatever the handler raises becomes a 500 JSON answer on that request, never a dead server.
"""
import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote, urlsplit

log = logging.getLogger(__name__)

MAX_HEAD_LINE = 16 * 1024
MAX_HEADERS = 100
MAX_BODY = 1024 * 1024
IDLE_TIMEOUT = 60.0  # seconds a kept-alive connection may sit between requests
BODY_TIMEOUT = 30.0
LINGER_SECONDS = 2.0  # after an error answer, how long to drain a client still sending
LINGER_MAX_BYTES = 4 * MAX_BODY
MAX_CONNECTIONS = 256  # an admin API has few clients; more connections than this are refused


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    path: str  # percent-decoded per segment by the router, raw here
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: bytes
    peer_host: str = ""  # the client's address


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class HttpError(Exception):
    """An error answer: `status` and a reason, sent as Pulsar's admin API sends them (`{"reason": ...}`)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def json_response(value: object, status: int = 200) -> Response:
    return Response(status, json.dumps(value, sort_keys=True).encode() + b"\n")


def error_response(status: int, reason: str) -> Response:
    return json_response({"reason": reason}, status)


Handler = Callable[[Request], Awaitable[Response]]


class _BadRequest(Exception):
    """The request cannot be read; answer `status` and close the connection."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class HttpServer:
    def __init__(self, handler: Handler, host: str, port: int) -> None:
        self._handler = handler
        self.host = host
        self._requested_port = port
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()
        self.port = port

    async def bind(self) -> None:
        """Take the port without serving yet (connections are refused until `start`); OSError when it cannot."""
        self._server = await asyncio.start_server(self._serve, self.host, self._requested_port,
                                                  limit=MAX_HEAD_LINE, start_serving=False)
        self.port = self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        if self._server is None:
            await self.bind()
        await self._server.start_serving()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            log.warning("admin API: refusing a connection, %d open", len(self._connections))
            writer.close()
            return
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            keep_alive = True
            while keep_alive:
                try:
                    request = await _read_request(reader, writer)
                except _BadRequest as exc:
                    await _write(writer, error_response(exc.status, str(exc)), keep_alive=False)
                    await _lingering_close(reader, writer)
                    return
                if request is None:
                    return
                keep_alive = _wants_keep_alive(request)
                response = await self._answer(request)
                await _write(writer, response, keep_alive, head_only=request.method == "HEAD")
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass  # the client went away or went quiet
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, request: Request) -> Response:
        try:
            return await self._handler(request)
        except HttpError as exc:
            response = error_response(exc.status, exc.reason)
            response.headers.update(getattr(exc, "headers", {}))
            return response
        except Exception:
            log.exception("admin %s %s failed", request.method, request.path)
            return error_response(500, "internal error, see the broker log")


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    """The next request, or None when the client closed the connection between requests."""
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), IDLE_TIMEOUT)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise _BadRequest(400, "incomplete request line") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest(414, "request line too long") from None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    headers = await _read_headers(reader)
    if "transfer-encoding" in headers:
        raise _BadRequest(411, "send the body with a Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise _BadRequest(400, "bad Content-Length") from None
    if not 0 <= length <= MAX_BODY:
        raise _BadRequest(413, f"body larger than {MAX_BODY} bytes")
    if length and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = await asyncio.wait_for(reader.readexactly(length), BODY_TIMEOUT) if length else b""
    url = urlsplit(target)
    query = dict(parse_qsl(url.query, keep_blank_values=True))
    peer = writer.get_extra_info("peername")
    return Request(method.upper(), version, url.path, query, headers, body,
                   peer[0] if isinstance(peer, tuple) else "")


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\r\n"), BODY_TIMEOUT)
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, "header line too long") from None
        except asyncio.IncompleteReadError:
            raise _BadRequest(400, "incomplete headers") from None
        if line == b"\r\n":
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name.strip():
            raise _BadRequest(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    raise _BadRequest(431, "too many header lines")


async def _lingering_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then drop what the client is still sending for a moment: closing with unread input makes the
    kernel reset the connection, which can destroy the error answer before the client reads it."""
    if writer.can_write_eof():
        writer.write_eof()
    deadline = asyncio.get_running_loop().time() + LINGER_SECONDS
    discarded = 0
    while discarded < LINGER_MAX_BYTES:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return
        chunk = await asyncio.wait_for(reader.read(65536), remaining)
        if not chunk:
            return
        discarded += len(chunk)


def _wants_keep_alive(request: Request) -> bool:
    connection = request.headers.get("connection", "").lower()
    if request.version == "HTTP/1.0":
        return connection == "keep-alive"
    return connection != "close"


async def _write(writer: asyncio.StreamWriter, response: Response, keep_alive: bool, head_only: bool = False) -> None:
    try:
        phrase = HTTPStatus(response.status).phrase
    except ValueError:
        phrase = "Status"
    lines = [f"HTTP/1.1 {response.status} {phrase}"]
    no_body = response.status == 204 or response.status < 200
    if not no_body:
        lines.append(f"Content-Type: {response.content_type}")
        lines.append(f"Content-Length: {len(response.body)}")
    lines.extend(f"{k}: {v}" for k, v in response.headers.items())
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    if not no_body and not head_only:
        writer.write(response.body)
    await writer.drain()


def path_segments(path: str) -> list[str]:
    """Split a URL path into percent-decoded segments (an encoded '/' stays inside its segment)."""
    return [unquote(s) for s in path.strip("/").split("/")] if path.strip("/") else []
