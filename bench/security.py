"""The price of security on one broker: produce throughput and broker CPU per MB over PLAINTEXT, SSL and SASL_SSL
(SCRAM-SHA-512) listeners of the same broker, interleaved round after round; then new SCRAM-SHA-256 sessions per
second (connect, SaslHandshake, two SaslAuthenticate rounds, close) and the broker CPU each costs, and the same for
PLAIN (whose check runs PBKDF2 on the broker).

    python -m bench.security                          # 200,000 x 100 B, 3 rounds, 300 sessions
    python -m bench.security --records 50000 --rounds 1 --sessions 100
"""
import argparse
import os
import socket
import tempfile
import time
from dataclasses import replace

import scramp
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from bench.brokers import create_topic
from bench.procstat import cpu_seconds
from bench.produce import ProduceSpec, produce, table
from bench.report import Table
from bench.stats import interleaved_order
from integration.broker_process import BrokerProcess, free_port
from integration.certificates import make_certificates
from integration.security_clients import ClientSecurity
from integration.test_bad_input import recv_exact

USER, PASSWORD = "bench", "bench-password"


def start_broker(root: str):
    certificates = make_certificates(os.path.join(root, "certs"))
    ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "SASL_SSL": free_port(), "SASL_PLAINTEXT": free_port()}
    broker = BrokerProcess(os.path.join(root, "data"), port=ports["PLAINTEXT"], admin_port=0, config={
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "ssl.keystore.location": certificates.broker}).start()
    import json
    import urllib.request
    request = urllib.request.Request(f"{broker.admin_url}/admin/v2/users/{USER}", method="POST",
                                     data=json.dumps({"password": PASSWORD}).encode())
    urllib.request.urlopen(request, timeout=10).read()
    return broker, ports, certificates


def throughput(broker, ports, certificates, spec: ProduceSpec, rounds: int) -> Table:
    variants = [("PLAINTEXT", ClientSecurity("PLAINTEXT")), ("SSL", ClientSecurity("SSL", certificates)),
                ("SASL_SSL SCRAM-SHA-512", ClientSecurity("SASL_SSL", certificates, mechanism="SCRAM-SHA-512",
                                                          user=USER, password=PASSWORD))]
    results = [[] for _ in variants]
    for r in range(rounds):
        for v in interleaved_order(len(variants), r):
            name, security = variants[v]
            protocol = name.split()[0]
            topic = f"bench-{protocol.lower()}-{r}"
            create_topic(f"127.0.0.1:{ports['PLAINTEXT']}", topic, spec.partitions)
            client = tuple((k, str(val)) for k, val in security.confluent().items())
            result = produce(f"127.0.0.1:{ports[protocol]}", topic, replace(spec, client=client), broker.proc.pid)
            results[v].append(result)
            print(f"  round {r + 1}/{rounds} {name}: {result.mb_per_s:.1f} MB/s, "
                  f"broker {result.broker_cpu_s / (result.delivered * spec.record_bytes / 1e6):.3f} CPU s/MB")
    produced = table(results, f"produce over each listener, {spec.shape}", [name for name, _ in variants])
    per_mb = Table("broker CPU per MB produced", ["listener", "CPU s/MB (median)"])
    for (name, _), runs in zip(variants, results):
        costs = sorted(r.broker_cpu_s / (r.delivered * spec.record_bytes / 1e6) for r in runs)
        per_mb.add(name, f"{costs[len(costs) // 2]:.3f}")
    return produced, per_mb


def frame(request, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="bench")
    return request.encode(header=True, framed=True)


def call(sock, request, response_class, version, correlation_id):
    sock.sendall(frame(request, correlation_id))
    size = int.from_bytes(recv_exact(sock, 4), "big")
    return response_class[version].decode(recv_exact(sock, size), version=version, header=True)


def login(port: int, mechanism: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert call(sock, SaslHandshakeRequest[1](mechanism=mechanism), SaslHandshakeResponse, 1, 1).error_code == 0
        if mechanism == "PLAIN":
            answer = call(sock, SaslAuthenticateRequest[2](auth_bytes=f"\0{USER}\0{PASSWORD}".encode()),
                          SaslAuthenticateResponse, 2, 2)
            assert answer.error_code == 0, answer
            return
        client = scramp.ScramClient([mechanism], USER, PASSWORD)
        first = call(sock, SaslAuthenticateRequest[2](auth_bytes=client.get_client_first().encode()),
                     SaslAuthenticateResponse, 2, 2)
        client.set_server_first(bytes(first.auth_bytes).decode())
        final = call(sock, SaslAuthenticateRequest[2](auth_bytes=client.get_client_final().encode()),
                     SaslAuthenticateResponse, 2, 3)
        assert final.error_code == 0, final
        client.set_server_final(bytes(final.auth_bytes).decode())


def sessions(broker, ports, count: int) -> Table:
    t = Table(f"new SASL sessions over SASL_PLAINTEXT, {count:,} one after another",
              ["mechanism", "sessions/s", "broker CPU ms/session"])
    for mechanism in ("SCRAM-SHA-256", "PLAIN"):
        cpu_before = cpu_seconds(broker.proc.pid)
        started = time.perf_counter()
        for _ in range(count):
            login(ports["SASL_PLAINTEXT"], mechanism)
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(broker.proc.pid) - cpu_before
        t.add(mechanism, f"{count / elapsed:,.0f}", f"{cpu / count * 1000:.2f}")
    t.notes.append("the client's own SCRAM work (PBKDF2 of the password, 8,192 iterations) is inside the wall time")
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="kop-bench-security-")
    broker, ports, certificates = start_broker(root)
    try:
        tables = [*throughput(broker, ports, certificates, ProduceSpec(args.records, args.size), args.rounds),
                  sessions(broker, ports, args.sessions)]
    finally:
        broker.stop()
    for t in tables:
        print(t.markdown() if args.markdown else t.text())
        print()


if __name__ == "__main__":
    main()
