"""A connection from this broker to one remote cluster's Kafka port, shared by the replicators toward it. Requests
are pipelined (Kafka answers them in order on one connection); a broken connection fails every request in flight
and the next request reconnects. It connects as the cluster's definition says, as a Kafka client would: over TLS
(SSL, SASL_SSL; the certificate checked against the given CA and the host name) and with SASL (PLAIN or SCRAM)
before anything else. Then ApiVersions must list ReplicateEntries: a broker that does not speak
it (Kafka itself, or an older kop), or does not answer, is disconnected with that reason, and no request goes on a
connection before that check passed."""
import asyncio
import itertools
import logging
import ssl
import struct
from collections import deque

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from kop.replication.clusters import Cluster
from kop.security.sasl_client import SaslClientError, sasl_client
from protocol.errors import ErrorCode
from protocol.replication import REPLICATE_ENTRIES_KEY

log = logging.getLogger(__name__)
_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 100 << 20


class LinkError(Exception):
    """The remote cannot be reached, broke the connection, or does not speak kop's replication."""


class RemoteLink:
    def __init__(self, cluster: Cluster, local_cluster: str, timeout_s: float = 30.0, *, client_id: str = "",
                 purpose: str = "replication link") -> None:
        """client_id, purpose: who this broker says it is (a replicator of `local_cluster` by default), and what the
        link is called in the log."""
        self.cluster = cluster
        self.client_id = client_id or f"kop-replicator-{local_cluster}"
        self.purpose = purpose
        self.timeout_s = timeout_s
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._in_flight: deque[tuple[int, asyncio.Future, type[ApiMessage], int]] = deque()
        self._correlation = itertools.count(1)
        self._connecting = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def send(self, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage:
        """Send a versioned request and return the remote's answer; raises LinkError."""
        if self._writer is None:
            async with self._connecting:
                if self._writer is None:
                    await self._connect()
        try:
            return await asyncio.wait_for(self._call(request, response_class), self.timeout_s)
        except asyncio.TimeoutError:
            self._broken(LinkError(f"no answer from {self.cluster.broker_url} within {self.timeout_s:.0f} s"))
            raise LinkError(f"no answer from {self.cluster.broker_url} within {self.timeout_s:.0f} s") from None

    async def authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """SASL, when the cluster's definition asks for it: SaslHandshake v1, then SaslAuthenticate until the
        mechanism's exchange is complete. Raises LinkError naming the reason the remote gave."""
        security = self.cluster.security
        if not security.sasl:
            return
        where = f"{self.cluster.name} at {self.cluster.broker_url}"
        handshake = await self._exchange(reader, writer, SaslHandshakeRequest[1](mechanism=security.sasl_mechanism),
                                         SaslHandshakeResponse)
        if handshake.error_code:
            raise LinkError(f"{where} does not accept SASL {security.sasl_mechanism} "
                            f"({ErrorCode(handshake.error_code).name}; it offers {', '.join(handshake.mechanisms)})")
        client = sasl_client(security.sasl_mechanism, security.sasl_username, security.sasl_password)
        token: bytes | None = client.first()
        while token is not None:
            answer = await self._exchange(reader, writer, SaslAuthenticateRequest[1](auth_bytes=token),
                                          SaslAuthenticateResponse)
            if answer.error_code:
                raise LinkError(f"authentication as {security.sasl_username} at {where} failed: "
                                f"{answer.error_message or ErrorCode(answer.error_code).name}")
            try:
                token = client.answer(answer.auth_bytes)
            except SaslClientError as exc:
                raise LinkError(f"authentication at {where}: {exc}") from None

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: ApiMessage,
                        response_class: type[ApiMessage]) -> ApiMessage:
        """One request and its answer, before the connection's reader runs (authentication)."""
        request.with_header(correlation_id=next(self._correlation), client_id=self.client_id)
        writer.write(bytes(request.encode(header=True, framed=True)))
        try:
            size = _SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), self.timeout_s))[0]
            if not 0 < size <= MAX_RESPONSE_BYTES:
                raise LinkError(f"response of {size} bytes")
            frame = await asyncio.wait_for(reader.readexactly(size), self.timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            raise LinkError(f"{self.cluster.name} at {self.cluster.broker_url} closed the connection or did not "
                            f"answer while authenticating: {exc or type(exc).__name__}") from None
        return response_class.decode(frame, version=request.API_VERSION, header=True)

    async def _connect(self) -> None:
        host, port = self.cluster.address
        security = self.cluster.security
        tls = ssl.create_default_context(cafile=security.ssl_ca_file or None) if security.tls else None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=tls), self.timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:  # ssl.SSLError is an OSError: a certificate not trusted
            raise LinkError(f"cannot connect to {self.cluster.name} at {self.cluster.broker_url} "
                            f"({security.protocol}): {exc or 'timed out'}") from None
        try:
            await self.authenticate(reader, writer)
        except LinkError:
            writer.close()
            raise
        self._reader_task = asyncio.create_task(self._read_responses(reader))
        # The link is usable (self._writer set) only once the remote was found to speak kop's replication.
        try:
            versions = await asyncio.wait_for(self._write(writer, ApiVersionsRequest[0](), ApiVersionsResponse),
                                              self.timeout_s)
            error = None if REPLICATE_ENTRIES_KEY in {key.api_key for key in versions.api_keys} else LinkError(
                f"the broker at {self.cluster.broker_url} (cluster {self.cluster.name}) does not speak kop's "
                f"replication protocol (api key {REPLICATE_ENTRIES_KEY} not in ApiVersions): it is not kop, or a kop "
                f"too old to replicate to")
        except asyncio.TimeoutError:
            error = LinkError(f"no ApiVersions answer from {self.cluster.broker_url} within {self.timeout_s:g} s")
        except LinkError as exc:
            error = exc
        if error is not None:
            writer.close()
            self._broken(error)
            raise error
        self._writer = writer
        log.info("%s to %s at %s connected", self.purpose, self.cluster.name, self.cluster.broker_url)

    def _call(self, request: ApiMessage, response_class: type[ApiMessage]) -> asyncio.Future:
        if self._writer is None:
            raise LinkError(f"not connected to {self.cluster.broker_url}")
        return self._write(self._writer, request, response_class)

    def _write(self, writer: asyncio.StreamWriter, request: ApiMessage,
               response_class: type[ApiMessage]) -> asyncio.Future:
        correlation_id = next(self._correlation)
        request.with_header(correlation_id=correlation_id, client_id=self.client_id)
        future = asyncio.get_running_loop().create_future()
        self._in_flight.append((correlation_id, future, response_class, request.API_VERSION))
        writer.write(bytes(request.encode(header=True, framed=True)))
        return future

    async def _read_responses(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                size = _SIZE.unpack(await reader.readexactly(4))[0]
                if not 0 < size <= MAX_RESPONSE_BYTES:
                    raise LinkError(f"response of {size} bytes")
                frame = await reader.readexactly(size)
                if not self._in_flight:
                    raise LinkError("a response to no request")
                correlation_id, future, response_class, version = self._in_flight.popleft()
                if _SIZE.unpack_from(frame)[0] != correlation_id:
                    raise LinkError("responses out of order")
                if not future.done():
                    future.set_result(response_class.decode(frame, version=version, header=True))
        except asyncio.CancelledError:
            raise
        except (OSError, asyncio.IncompleteReadError, LinkError, ValueError) as exc:
            self._broken(LinkError(f"connection to {self.cluster.name} at {self.cluster.broker_url} lost: "
                                   f"{exc or type(exc).__name__}"))

    def _broken(self, error: LinkError) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        while self._in_flight:
            future = self._in_flight.popleft()[1]
            if not future.done():
                future.set_exception(error)
        if self._reader_task is not None and self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
        self._reader_task = None

    async def close(self) -> None:
        self._broken(LinkError("link closed"))
