"""What one broker spends per connection, per idempotent producer and per consumer group, and that it gives it
back: each population is created, measured and closed three times over, and the broker's memory after each round
must stay flat (nothing grows without bound).

    python -m bench.connections                                      # 10,000 / 1,000 / 1,000
    python -m bench.connections --connections 1000 --producers 100 --groups 100 --rounds 2
"""
import argparse
import socket
import struct
import sys
import time
from dataclasses import dataclass

from bench.brokers import running_broker
from bench.procstat import open_descriptors, rss_bytes
from bench.report import Table
from integration.idem_raw import RawKafka, idempotent_batch
from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
from protocol.errors import ErrorCode

API_VERSIONS, OFFSET_COMMIT = 18, 8
TOPIC = "bench-state"


@dataclass(frozen=True)
class Spec:
    connections: int = 10_000
    producers: int = 1_000
    groups: int = 1_000
    rounds: int = 3


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def api_versions_frame(correlation_id: int) -> bytes:
    request = REQUEST_CLASSES[API_VERSIONS][3](client_software_name="bench", client_software_version="1")
    request.with_header(correlation_id=correlation_id, client_id="bench")
    return request.encode(header=True, framed=True)


def read_answer(sock: socket.socket) -> None:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    if len(sock.recv(size, socket.MSG_WAITALL)) != size:
        raise ConnectionError("short answer")


def open_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections, each with an ApiVersions answered (so the broker holds each as a live client)."""
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(api_versions_frame(i))
        socks.append(sock)
    for sock in socks:
        read_answer(sock)
    return socks


def register_producers(port: int, count: int) -> None:
    """`count` idempotent producers, each with an id from InitProducerId and one batch stored under it."""
    with RawKafka(port, timeout=30) as raw:
        for i in range(count):
            identity = raw.init_producer_id()
            batch = idempotent_batch([b"v%d" % i], producer_id=identity.producer_id, epoch=identity.producer_epoch,
                                     base_sequence=0)
            answer = raw.produce(TOPIC, 0, batch)
            if answer.error_code != ErrorCode.NONE:
                raise RuntimeError(f"produce answered {answer.error_code}")


def commit_for_groups(port: int, count: int, round_: int) -> None:
    """An offset commit (no group membership, as a simple consumer commits) for each of `count` groups."""
    version = 8
    Req = REQUEST_CLASSES[OFFSET_COMMIT][version]
    Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    with RawKafka(port, timeout=30) as raw:
        for i in range(count):
            request = Req(group_id=f"bench-group-{round_}-{i}", generation_id_or_member_epoch=-1, member_id="",
                          group_instance_id=None, topics=[Req.OffsetCommitRequestTopic(
                              name=TOPIC, partitions=[Part(partition_index=0, committed_offset=1,
                                                           committed_leader_epoch=-1, committed_metadata="")])])
            response = raw.call(request, RESPONSE_CLASSES[OFFSET_COMMIT], version)
            code = response.topics[0].partitions[0].error_code
            if code != ErrorCode.NONE:
                raise RuntimeError(f"offset commit answered {code}")


def wait_for_closes(pid: int, descriptors: int, timeout_s: float = 120.0) -> None:
    """Until the broker has seen every closed connection go (its descriptors back to `descriptors` or fewer) and
    its memory has settled (less than 1 MiB of change over two seconds), so the next figure is not this release."""
    deadline = time.monotonic() + timeout_s
    while open_descriptors(pid) > descriptors and time.monotonic() < deadline:
        time.sleep(0.2)
    previous = rss_bytes(pid)
    while time.monotonic() < deadline:
        time.sleep(2)
        now = rss_bytes(pid)
        if abs(now - previous) < 2**20:
            return
        previous = now


def run(spec: Spec) -> Table:
    """Round 1 on a fresh broker gives the cost of each (RSS growth while they are created); every round ends with
    all of them closed and gives the broker's RSS then. Later rounds' growth figures would mix in memory the broker
    is still giving back from the round before, so they are not shown."""
    table = Table("per connection, producer and group on one broker (RSS)",
                  ["round", "per connection", "per idempotent producer", "per group", "RSS after closing all"])
    with running_broker() as broker:
        pid = broker.proc.pid
        with RawKafka(broker.port) as raw:
            raw.create_topic(TOPIC, 1)
        base, base_descriptors = rss_bytes(pid), open_descriptors(pid)
        for round_ in range(spec.rounds):
            log(f"round {round_ + 1}: {spec.producers:,} producers, {spec.groups:,} groups ...")
            before = rss_bytes(pid)
            register_producers(broker.port, spec.producers)
            per_producer = (rss_bytes(pid) - before) / spec.producers
            before = rss_bytes(pid)
            commit_for_groups(broker.port, spec.groups, round_)
            per_group = (rss_bytes(pid) - before) / spec.groups
            log(f"round {round_ + 1}: {spec.connections:,} connections ...")
            before = rss_bytes(pid)
            socks = open_connections(broker.port, spec.connections)
            per_connection = (rss_bytes(pid) - before) / spec.connections
            for sock in socks:
                sock.close()
            wait_for_closes(pid, base_descriptors + 16)
            costs = (f"{per_connection / 1024:.1f} KiB", f"{per_producer / 1024:.2f} KiB",
                     f"{per_group / 1024:.2f} KiB") if round_ == 0 else ("", "", "")
            table.add(str(round_ + 1), *costs, f"{(rss_bytes(pid) - base) / 2**20:+.1f} MiB")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=Spec.connections)
    parser.add_argument("--producers", type=int, default=Spec.producers)
    parser.add_argument("--groups", type=int, default=Spec.groups)
    parser.add_argument("--rounds", type=int, default=Spec.rounds)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    table = run(Spec(args.connections, args.producers, args.groups, args.rounds))
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
