"""Requests from this broker to another broker of its cluster (transaction markers, verifications, a transaction's
offsets): one pipelined connection per peer, to the peer's endpoint on the inter-broker listener
(`inter.broker.listener.name`, else the first listener; by name: the brokers of a cluster share their listener
names). A connection that breaks fails its requests in flight (the caller retries) and the next request connects
again, to wherever the peer is now.

The connection is a plain Kafka one, without TLS or SASL: the inter-broker listener must be PLAINTEXT (an internal
one beside the secured listeners clients use). On a secured one these requests fail with that reason, and the log
says so once per peer."""
import logging
from collections.abc import Callable

from kafka.protocol.api_message import ApiMessage

from kop.cluster.membership import Member
from kop.replication.clusters import Cluster
from kop.replication.link import LinkError, RemoteLink

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0


class PeerUnreachable(Exception):
    """No live broker has that node id, or it did not answer."""


class Peers:
    def __init__(self, me: int, listener: str, plaintext: bool, members: Callable[[], list[Member]]) -> None:
        self._me = me
        self._listener = listener
        self._plaintext = plaintext
        self._members = members
        self._links: dict[int, RemoteLink] = {}  # node id -> the connection to it (at the address it had then)
        self._warned: set[int] = set()

    async def call(self, node: int, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage:
        """Send a request to broker `node` and return its answer; raises PeerUnreachable."""
        if not self._plaintext:
            if node not in self._warned:
                self._warned.add(node)
                log.error("cannot send broker %d inter-broker requests: listener %s is secured (TLS or SASL), which "
                          "they do not speak yet: set inter.broker.listener.name to a PLAINTEXT listener", node,
                          self._listener)
            raise PeerUnreachable(f"listener {self._listener} is secured")
        member = next((m for m in self._members() if m.node_id == node), None)
        address = member.endpoints.get(self._listener) if member is not None else None
        if address is None:
            raise PeerUnreachable(f"broker {node} is not live")
        host, port = address
        link = self._links.get(node)
        if link is None or link.cluster.address != (host, port):
            if link is not None:
                await link.close()
            link = self._links[node] = RemoteLink(Cluster(f"broker-{node}", f"{host}:{port}"), "", TIMEOUT_S,
                                                  client_id=f"kop-broker-{self._me}", purpose="inter-broker link")
        try:
            return await link.send(request, response_class)
        except LinkError as exc:
            raise PeerUnreachable(str(exc)) from None

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()
        self._links.clear()
