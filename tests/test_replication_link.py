"""The replication link's first exchange, against a TCP server that takes the connection and never answers: the
ApiVersions check times out, every request waiting on the link fails with a LinkError, the connection is closed,
and nothing but ApiVersions is ever sent on it (a ReplicateEntries request must never go to a broker that was not
found to speak it)."""
from __future__ import annotations

import asyncio
import struct


from kop.replication.clusters import Cluster
from kop.replication.link import LinkError, RemoteLink
from protocol.replication import ReplicateEntriesRequest, ReplicateEntriesResponse

API_VERSIONS = 18


class SilentBroker:
    """Reads request frames, notes their API keys, answers nothing; notes when a connection is closed."""

    def __init__(self) -> None:
        self.api_keys: list[int] = []
        self.connections = self.closed = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                self.api_keys.append(struct.unpack_from(">h", frame)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed += 1
        finally:
            writer.close()


def entries_request() -> ReplicateEntriesRequest:
    return ReplicateEntriesRequest[0](source_cluster="east", target_cluster="west", timeout_ms=1000, topics=[])


async def test_a_remote_that_never_answers_api_versions_is_disconnected_and_sent_nothing_else():
    silent = SilentBroker()
    server = await asyncio.start_server(silent.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    link = RemoteLink(Cluster("west", f"127.0.0.1:{port}"), "east", timeout_s=0.5)
    try:
        results = await asyncio.gather(*(link.send(entries_request(), ReplicateEntriesResponse) for _ in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(result, LinkError) for result in results), results
        assert "ApiVersions" in str(results[0])
        assert not link.connected
        for _ in range(100):  # bounded: the server sees the close
            if silent.closed == silent.connections:
                break
            await asyncio.sleep(0.02)
        assert silent.connections >= 1  # control: the link did connect
        assert silent.closed == silent.connections
        assert silent.api_keys and set(silent.api_keys) == {API_VERSIONS}
    finally:
        await link.close()
        server.close()
        await server.wait_closed()
