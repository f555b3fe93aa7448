"""What connections that never authenticate cost a broker: N clients connect to a SASL listener (SASL_PLAINTEXT, or
SASL_SSL with the TLS handshake done), each sends ApiVersions, is answered, and then sends nothing more. The
broker's RSS growth per connection is the figure; all are closed and the broker must still serve.

    python -m bench.unauthenticated                      # 10,000 of each
    python -m bench.unauthenticated --connections 1000
"""
import argparse
import os
import resource
import socket
import ssl
import sys
import tempfile
import time

from bench.connections import api_versions_frame, wait_for_closes
from bench.procstat import open_descriptors, rss_bytes
from bench.report import Table
from integration.broker_process import BrokerProcess, free_port
from integration.certificates import make_certificates
from integration.test_bad_input import recv_exact


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def read_answer(sock: socket.socket) -> None:
    """One framed answer (TLS sockets take no recv flags, so read in a loop)."""
    recv_exact(sock, int.from_bytes(recv_exact(sock, 4), "big"))


def open_idle(port: int, count: int, tls: ssl.SSLContext | None) -> list[socket.socket]:
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
        sock.sendall(api_versions_frame(i))
        read_answer(sock)
        socks.append(sock)
    return socks


def measure(broker: BrokerProcess, port: int, count: int, tls: ssl.SSLContext | None) -> tuple[float, float]:
    """(RSS bytes per idle connection, seconds to open them all)."""
    pid = broker.proc.pid
    descriptors = open_descriptors(pid)
    before = rss_bytes(pid)
    started = time.monotonic()
    socks = open_idle(port, count, tls)
    elapsed = time.monotonic() - started
    grown = rss_bytes(pid) - before
    for sock in socks:
        sock.close()
    wait_for_closes(pid, descriptors + 16)
    return grown / count, elapsed


def run(count: int) -> Table:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1024)), hard))
    root = tempfile.mkdtemp(prefix="kop-bench-unauth-")
    certificates = make_certificates(os.path.join(root, "certs"))
    sasl, sasl_ssl = free_port(), free_port()
    broker = BrokerProcess(os.path.join(root, "data"), port=sasl, config={
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{sasl},SASL_SSL://127.0.0.1:{sasl_ssl}",
        "ssl.keystore.location": certificates.broker, "max.connections": str(2 * count + 100)})
    table = Table(f"{count:,} connections that never authenticate (broker RSS)",
                  ["listener", "per connection", "opened in"])
    broker.start()
    try:
        for name, port, tls in (("SASL_PLAINTEXT", sasl, None),
                                ("SASL_SSL", sasl_ssl, ssl.create_default_context(cafile=certificates.ca))):
            log(f"{name}: {count:,} connections ...")
            per_connection, elapsed = measure(broker, port, count, tls)
            table.add(name, f"{per_connection / 1024:.1f} KiB", f"{elapsed:.1f} s")
        with socket.create_connection(("127.0.0.1", sasl), timeout=10) as control:  # still serving
            control.sendall(api_versions_frame(1))
            read_answer(control)
    finally:
        broker.stop()
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    table = run(args.connections)
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
