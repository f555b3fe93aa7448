"""Requests from this broker to another broker of its cluster (transaction markers, verifications, a transaction's
offsets): one pipelined connection per peer, to the peer's endpoint on the inter-broker listener
(`inter.broker.listener.name`, else the one `security.inter.broker.protocol` names, else the first listener; by
name: the brokers of a cluster share their listener names). A connection that breaks fails its requests in flight
(the caller retries) and the next request connects again, to wherever the peer is now.

The connection speaks the listener's security protocol, as a Kafka broker's does: TLS (SSL, SASL_SSL) checking the
peer's certificate against the truststore and showing this broker's own, SASL (SASL_PLAINTEXT, SASL_SSL) with
`sasl.mechanism.inter.broker.protocol` as the broker's own user. With an authorizer these requests need
CLUSTER_ACTION on the cluster for that principal (a super user, usually)."""
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka.protocol.api_message import ApiMessage

from kop.cluster.membership import Member
from kop.replication.clusters import PLAINTEXT, Cluster, LinkSecurity
from kop.replication.link import LinkError, RemoteLink

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0


class PeerUnreachable(Exception):
    """No live broker has that node id, or it did not answer."""


@dataclass(frozen=True)
class PeerSecurity:
    """How this broker reaches the others: the inter-broker listener's name and security."""
    listener: str
    security: LinkSecurity = PLAINTEXT
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    problem: str | None = None  # why no request can be sent (no credentials for a SASL listener)


class Peers:
    def __init__(self, me: int, security: PeerSecurity, members: Callable[[], list[Member]]) -> None:
        self._me = me
        self._security = security
        self._members = members
        self._links: dict[int, RemoteLink] = {}  # node id -> the connection to it (at the address it had then)
        self._failing: dict[int, str] = {}  # node id -> why the last request to it failed (logged once)

    async def call(self, node: int, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage:
        """Send a request to broker `node` and return its answer; raises PeerUnreachable."""
        listener = self._security.listener
        if self._security.problem is not None:
            self._note_failure(node, self._security.problem)
            raise PeerUnreachable(self._security.problem)
        member = next((m for m in self._members() if m.node_id == node), None)
        address = member.endpoints.get(listener) if member is not None else None
        if address is None:
            raise PeerUnreachable(f"broker {node} is not live")
        host, port = address
        link = self._links.get(node)
        if link is None or link.cluster.address != (host, port):
            if link is not None:
                await link.close()
            link = self._links[node] = RemoteLink(
                Cluster(f"broker-{node}", f"{host}:{port}", security=self._security.security), "", TIMEOUT_S,
                client_id=f"kop-broker-{self._me}", purpose="inter-broker link", tls=self._security.tls)
        try:
            answer = await link.send(request, response_class)
        except LinkError as exc:
            self._note_failure(node, str(exc))
            raise PeerUnreachable(str(exc)) from None
        if self._failing.pop(node, None) is not None:
            log.info("inter-broker requests to broker %d go through again", node)
        return answer

    def _note_failure(self, node: int, why: str) -> None:
        """Log why requests to a broker fail once, not at every retry."""
        if self._failing.get(node) != why:
            self._failing[node] = why
            log.warning("inter-broker requests to broker %d fail (retried): %s", node, why)

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()
        self._links.clear()
