"""The admin API's HTTP layer against hostile and unusual clients, over raw sockets: every malformed request gets an
error answer (or a closed connection), keep-alive and HTTP/1.0 behave as specified, and the server keeps serving."""
import json
import socket

import pytest

from integration.broker_process import BrokerProcess

DEDUP = "/admin/v2/namespaces/public/default/deduplication"


@pytest.fixture(scope="module")
def admin_broker(tmp_path_factory):
    broker = BrokerProcess(str(tmp_path_factory.mktemp("admin-http") / "data"), admin_port=0).start()
    yield broker
    broker.stop()


def connect(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.admin_port), timeout=10)
    sock.settimeout(10)
    return sock


def read_response(sock: socket.socket, buffered: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One response (status, lower-cased headers, body) from sock; leftover bytes stay in `buffered`."""
    data = buffered if buffered is not None else bytearray()
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a full response head: {bytes(data)!r}")
        data += chunk
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a response body")
        body += chunk
    data[:] = body[length:]
    return status, headers, bytes(body[:length])


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def still_serving(broker: BrokerProcess) -> bool:
    with connect(broker) as sock:
        sock.sendall(f"GET {DEDUP} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        status, _, body = read_response(sock)
    return status == 200 and json.loads(body) is None


def test_two_requests_on_one_kept_alive_connection(admin_broker):
    with connect(admin_broker) as sock:
        buffered = bytearray()
        # Both requests in one write: the server must answer them in order on the same connection.
        sock.sendall((f"GET {DEDUP}?applied=true HTTP/1.1\r\nHost: x\r\n\r\n"
                      f"GET {DEDUP} HTTP/1.1\r\nHost: x\r\n\r\n").encode())
        first = read_response(sock, buffered)
        second = read_response(sock, buffered)
        assert (first[0], json.loads(first[2])) == (200, True)
        assert (second[0], json.loads(second[2])) == (200, None)
        assert first[1]["connection"] == "keep-alive" and first[1]["content-type"] == "application/json"


def test_http_1_0_closes_after_the_answer(admin_broker):
    with connect(admin_broker) as sock:
        sock.sendall(f"GET {DEDUP} HTTP/1.0\r\n\r\n".encode())
        status, headers, _ = read_response(sock)
        assert status == 200 and headers["connection"] == "close"
        assert closed_by_server(sock)


def test_expect_100_continue_then_the_answer(admin_broker):
    with connect(admin_broker) as sock:
        sock.sendall(f"POST {DEDUP} HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
                     .encode())
        buffered = bytearray()
        assert read_response(sock, buffered)[0] == 100
        sock.sendall(b"true")
        assert read_response(sock, buffered)[0] == 204
        sock.sendall(f"DELETE {DEDUP} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_response(sock, buffered)[0] == 204


@pytest.mark.parametrize("request_bytes, status", [
    (b"HELLO\r\n\r\n", 400),
    (b"GET / SPDY/3\r\n\r\n", 400),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n", 431),
    (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (f"POST {DEDUP} HTTP/1.1\r\nContent-Length: nope\r\n\r\n".encode(), 400),
    (f"POST {DEDUP} HTTP/1.1\r\nContent-Length: -5\r\n\r\n".encode(), 413),
    (f"POST {DEDUP} HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n".encode(), 413),
    (f"POST {DEDUP} HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ntrue\r\n0\r\n\r\n".encode(), 411),
])
def test_malformed_requests_get_an_error_and_a_closed_connection(admin_broker, request_bytes, status):
    with connect(admin_broker) as sock:
        sock.sendall(request_bytes)
        answer_status, headers, body = read_response(sock)
        assert answer_status == status and json.loads(body)["reason"]
        assert headers["connection"] == "close" and closed_by_server(sock)
    assert still_serving(admin_broker)


def test_clients_that_vanish_mid_request_do_not_hurt_the_server(admin_broker):
    for partial in (b"GET /admin/v2", f"GET {DEDUP} HTTP/1.1\r\nHost:".encode(),
                    f"POST {DEDUP} HTTP/1.1\r\nContent-Length: 100\r\n\r\ntr".encode()):
        with connect(admin_broker) as sock:
            sock.sendall(partial)
    assert still_serving(admin_broker)
    # Nothing was set by the cut-off POST.
    with connect(admin_broker) as sock:
        sock.sendall(f"GET {DEDUP} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert json.loads(read_response(sock)[2]) is None


def test_head_answers_without_a_body(admin_broker):
    with connect(admin_broker) as sock:
        sock.sendall(f"HEAD {DEDUP} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = bytearray()
        while chunk := sock.recv(65536):
            data += chunk
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 5" in head and body == b""
