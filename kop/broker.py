"""The broker: configuration, storage, the request router and the TCP listener, as one object that a test can start
twice in one process."""
import asyncio
import collections
import errno
import functools
import logging
import os
import socket
from collections.abc import Awaitable

from kop import clock, handlers
from kop.admin.metrics import BrokerCollector, BrokerMetrics
from kop.admin.server import AdminServer
from kop.byte_budget import ByteBudget
from kop.cluster import Cluster, ClusterService, Member, SingleBroker
from kop.compaction.cleaner import LogCleaner
from kop.cluster.peers import PeerSecurity
from kop.config import (BrokerConfig, inter_broker_listener, inter_broker_mechanism, inter_broker_problem,
                        listener_specs, settings_not_default)
from kop.connection import Connection
from kop.data_dir import DataDirLock
from kop.dynamic import BrokerSettings
from kop.fetch_sessions import FetchSessionCache
from kop.groups import GroupCoordinator
from kop.policies import PolicyBook
from kop.producer_ids import ProducerIdAllocator, cluster_tag
from kop.replication.clusters import ClusterRegistry, LinkSecurity
from kop.replication.service import ReplicationService
from kop.security.acls import Authorizer
from kop.security.listeners import ListenerSpec
from kop.security.quotas import QuotaBook, QuotaMeter
from kop.security.tls import TlsSettings, client_context, server_context
from kop.security.users import UserStore
from kop.shared_book import SharedBook
from kop.startup import StartupError, bind_failure, reading
from kop.topic_storage import PgTopicStorage
from kop.topics import TopicManager, deletes_by_retention
from kop.transactions.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)

MAX_NAMED = 10  # partitions a readiness answer names


class Broker:
    def __init__(self, config: BrokerConfig, *, admin_port_may_be_taken: bool = False,
                 explicit_settings: frozenset[str] | None = None) -> None:
        """admin_port_may_be_taken: when the admin port is in use, run without the admin API instead of failing
        (kop standalone's default port gives way, so a second standalone on one machine still starts).
        explicit_settings: the config fields the operator set (reported as STATIC_BROKER_CONFIG); by default those
        not at their default value."""
        # the settings in force (`config`): these with the dynamic configs over them (kop/dynamic)
        self.settings = BrokerSettings(config, settings_not_default(config) if explicit_settings is None
                                       else explicit_settings)
        self.settings.subscribe(self._reconfigure)
        self._admin_port_may_be_taken = admin_port_may_be_taken
        self._lock: DataDirLock | None = None
        self.policies = PolicyBook(config)
        self.metrics = BrokerMetrics()
        self.topics = TopicManager(config, self.policies, self.metrics.observe_flush)
        self.groups = GroupCoordinator(config, self.topics)
        self.clusters = ClusterRegistry(config.data_dir, durable=config.fsync)
        self.replication = ReplicationService(config, self.topics, self.policies, self.clusters, self.groups)
        self.cleaner = LogCleaner(self.topics, self.metrics, config.log_cleaner_io_max_bytes_per_second or float("inf"))
        self.api_router = handlers.build_api_router()
        self.users = UserStore(config.data_dir, durable=config.fsync)
        self.quota_book = QuotaBook(config.data_dir, durable=config.fsync)
        self.quota_meter = QuotaMeter(self.quota_book)
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        self.authorizer = Authorizer(config.data_dir, config.super_users, config.allow_everyone_if_no_acl_found,
                                     config.authorizer_enabled, durable=config.fsync)
        self.producer_ids: ProducerIdAllocator | None = None
        self.transactions: TransactionCoordinator | None = None
        self.cluster: Cluster | None = None  # who serves which partition: set once the ports are bound
        self.listeners = listener_specs(config)
        self._servers: list[tuple[ListenerSpec, asyncio.AbstractServer]] = []
        self.ports: dict[str, int] = {}  # listener name -> the port bound
        self._connections: dict[Connection, str] = {}  # open connections, each with its client's address
        self._per_address: collections.Counter[str] = collections.Counter()  # open connections per client address
        self.request_bytes = ByteBudget(config.queued_max_request_bytes)  # unanswered request bytes, all connections
        self._background: list[asyncio.Task] = []
        self.port = config.port
        self._admin: AdminServer | None = None
        self.admin_port = 0  # the admin HTTP port bound, 0 when the admin API is off
        self.loaded = False  # topics and groups loaded: the admin API serves more than its probes
        self.serving = False  # Kafka clients are served
        self.metrics.registry.register(BrokerCollector(self))

    @property
    def config(self) -> BrokerConfig:
        return self.settings.current

    async def _reconfigure(self, config: BrokerConfig) -> None:
        """Hand changed settings to the subsystems that act on dynamic ones; the broker's own (retention, connection
        limits) are read from `config` where they are used."""
        self.topics.reconfigure(config)
        self.groups.reconfigure(config)
        if self.transactions is not None:
            self.transactions.config = config

    @property
    def shared_books(self) -> list[SharedBook]:
        """The settings every broker of a cluster shares (kop/shared_book.py)."""
        return [self.users, self.authorizer, self.quota_book, self.clusters]

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def not_ready(self) -> list[str]:
        """What keeps the broker from serving everything it holds (empty when ready): the ports not yet serving,
        partitions still loading, partitions whose deduplication state is not recovered."""
        reasons = []
        if not self.serving:
            reasons.append("the Kafka port is not serving yet")
        loaded, total = self.topics.load_progress
        if not self.topics.storage_open:
            reasons.append("opening the storage")
        elif loaded < total:
            reasons.append(f"loading partitions: {loaded} of {total} loaded")
        recovering = [p.name for p in self.topics.all_partitions() if p.dedup.awaiting_recovery]
        if recovering:
            shown = ", ".join(recovering[:MAX_NAMED])
            more = f" and {len(recovering) - MAX_NAMED} more" if len(recovering) > MAX_NAMED else ""
            reasons.append(f"deduplication state not recovered: {shown}{more}")
        return reasons
    def advertised_port(self, listener: ListenerSpec) -> int:
        return listener.advertised_port or self.ports[listener.name]

    async def bind(self) -> None:
        """Claim the data directory and the ports before anything is read, so a second broker on the directory or a
        port in use fails at once (StartupError) rather than after recovery. The sockets are bound but do not listen
        until `start` has loaded the topics: clients are refused, never served half-loaded state."""
        self._lock = DataDirLock.acquire(self.config.data_dir)
        try:
            tls = self._tls_context() if any(listener.tls for listener in self.listeners) else None
            for listener in self.listeners:
                await self._bind_listener(listener, tls if listener.tls else None)
            self.port = self.ports[self.listeners[0].name]
            if self.config.admin_port != 0:
                await self._bind_admin()
        except BaseException:
            await self._close_listeners()
            self._release_data_dir()
            raise

    def _tls_context(self):
        config = self.config
        try:
            return server_context(TlsSettings(config.ssl_keystore_location, config.ssl_key_password,
                                              config.ssl_truststore_location, config.ssl_client_auth))
        except ValueError as exc:
            raise StartupError(f"cannot serve TLS: {exc}") from None

    async def _bind_listener(self, listener: ListenerSpec, tls) -> None:
        tls_options = {"ssl": tls, "ssl_handshake_timeout": self.config.ssl_handshake_timeout_ms / 1000} if tls else {}
        try:
            server = await asyncio.get_running_loop().create_server(
                functools.partial(Connection, self, listener), listener.host, listener.port, backlog=1024,
                start_serving=False, **tls_options)
        except OSError as exc:
            raise bind_failure(exc, listener.host, listener.port, self._purpose(listener)) from None
        self._servers.append((listener, server))
        self.ports[listener.name] = server.sockets[0].getsockname()[1]

    def _purpose(self, listener: ListenerSpec) -> str:
        return f"Kafka clients ({listener.name} listener)" if len(self.listeners) > 1 else "Kafka clients"

    async def _bind_admin(self) -> None:
        admin = AdminServer(self)
        try:
            await admin.bind()
        except OSError as exc:
            if not (self._admin_port_may_be_taken and exc.errno == errno.EADDRINUSE):
                raise bind_failure(exc, self.config.admin_host, self.config.admin_port, "the admin API") from None
            log.warning("admin port %d is in use; running without the admin API (set --admin-port)",
                        self.config.admin_port)
            return
        self._admin = admin
        self.admin_port = admin.port

    async def start(self) -> None:
        if self._lock is None:
            await self.bind()
        with reading(self.policies.path):
            self.policies.load()
        with reading(self.clusters.path):
            self.clusters.load()
        with reading(self.users.path):
            self.users.load()
        with reading(self.authorizer.path):
            self.authorizer.load()
        with reading(self.quota_book.path):
            self.quota_book.load()
        with reading(self.settings.store.path):
            self.settings.load()
        if self._admin is not None:  # its probes answer while the topics load; the rest waits for them
            await _listen(self._admin.start(), self.config.admin_host, self.admin_port, "the admin API")
        await self.topics.open_storage()
        if isinstance(self.topics.storage, PgTopicStorage):  # shared by the brokers of the database
            await self.policies.share_through(self.topics.storage.store)
            await self.settings.share_through(self.topics.storage.store)
            for book in self.shared_books:
                await book.share_through(self.topics.storage.store)
        await self._reconfigure(self.config)  # the dynamic configs stored, before anything acts on settings
        self.cluster = self._cluster()
        await self.cluster.join()
        await self.topics.load_all(self.cluster.owns)
        self.producer_ids = ProducerIdAllocator(self.topics.storage.producer_id_blocks(),
                                                cluster_tag(self.config.cluster_name))
        await self.cluster.serve_groups(self.groups)
        self.replication.positions.others = self.cluster.coordinators()  # PIP-33 reaches every coordinator
        await self.groups.start()  # needs the topics: groups are found from their partitions' cursors
        self.transactions = TransactionCoordinator(self.config, self.topics, self.groups, self.producer_ids)
        await self.cluster.serve_transactions(self.transactions)
        self.transactions.start()  # needs both: prepared transactions write markers and offsets
        self.loaded = True
        for listener, server in self._servers:
            await _listen(server.start_serving(), listener.host, self.ports[listener.name], self._purpose(listener))
        self.serving = True
        self.cluster.start()
        self.replication.start()
        self._background.append(asyncio.create_task(self._retention_loop()))
        if self.config.log_cleaner_enable:
            self._background.append(asyncio.create_task(
                self.cleaner.run(self.config.log_cleaner_backoff_ms / 1000)))
        self._background.append(asyncio.create_task(self._dedup_snapshot_loop()))
        self._background.append(asyncio.create_task(self._dedup_purge_loop()))
        listening = ", ".join(f"{listener.name}://{listener.host}:{self.ports[listener.name]}"
                              for listener in self.listeners)
        log.info("kop listening on %s (data in %s)", listening, self.config.data_dir)

    def _cluster(self) -> Cluster:
        """This broker alone (file storage), or a member of the cluster of every broker on its PostgreSQL database."""
        me = Member(self.config.node_id, {listener.name: (listener.advertised_host, self.advertised_port(listener))
                                          for listener in self.listeners})
        storage = self.topics.storage
        if not isinstance(storage, PgTopicStorage):
            return SingleBroker(me)
        home = f"{socket.gethostname()}:{os.path.abspath(self.config.data_dir)}"
        return ClusterService(storage.store, self.topics, me, home, self.config.broker_session_timeout_ms,
                              self.config.broker_heartbeat_interval_ms, self._peer_security(), self.config.fsync,
                              self.shared_books, self.settings.reload)

    def _peer_security(self) -> PeerSecurity:
        """How this broker reaches the others: the inter-broker listener's protocol, with its own credentials."""
        config = self.config
        between = inter_broker_listener(config, self.listeners)
        problem = inter_broker_problem(config)
        if problem is not None:
            log.warning("%s: requests to the other brokers (transaction markers, offsets) will fail", problem)
        sasl = between.sasl and problem is None
        security = LinkSecurity(between.protocol, (inter_broker_mechanism(config) or "") if sasl else "",
                                config.inter_broker_sasl_username if sasl else "",
                                config.inter_broker_sasl_password if sasl else "")
        tls = None
        if between.tls:
            try:
                tls = client_context(TlsSettings(config.ssl_keystore_location, config.ssl_key_password,
                                                 config.ssl_truststore_location, config.ssl_client_auth),
                                     check_hostname=config.ssl_endpoint_identification_algorithm == "https")
            except ValueError as exc:
                raise StartupError(f"cannot reach the other brokers over TLS: {exc}") from None
        return PeerSecurity(between.name, security, tls, problem)

    async def _close_listeners(self) -> None:
        if self._admin is not None:
            await self._admin.stop()
        for _listener, server in self._servers:
            server.close()

    def admit_connection(self, connection: Connection, address: str) -> bool:
        """Whether a new connection may stay open (max.connections, max.connections.per.ip); it is counted if so."""
        if len(self._connections) >= self.config.max_connections:
            log.warning("refusing a connection: %d open (max_connections)", len(self._connections))
            return False
        if self._per_address[address] >= self.config.max_connections_per_ip:
            log.info("refusing a connection from %s: %d open from there (max.connections.per.ip)", address,
                     self._per_address[address])
            return False
        self._connections[connection] = address
        self._per_address[address] += 1
        return True

    def forget_connection(self, connection: Connection) -> None:
        address = self._connections.pop(connection, None)
        if address is not None:
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]

    async def _retention_loop(self) -> None:
        interval = max(1.0, self.config.retention_check_interval_ms / 1000)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.enforce_retention()
            except Exception:
                log.exception("retention check failed")

    async def enforce_retention(self) -> None:
        now = clock.now_ms()
        for topic in list(self.topics.topics.values()):
            if deletes_by_retention(topic.configs):
                retention_ms = int(topic.configs.get("retention.ms", self.config.retention_ms))
                retention_bytes = int(topic.configs.get("retention.bytes", self.config.retention_bytes))
            else:  # kept whole: only an idle ledger's roll (segment.ms, so the cleaner gets it) and DeleteRecords
                retention_ms = retention_bytes = -1
            for partition in topic.partitions:
                await partition.enforce_retention(now, retention_ms, retention_bytes,
                                                  self.config.replication_backlog_quota_limit_bytes)

    async def _dedup_snapshot_loop(self) -> None:
        """PIP-6 time-based snapshots: each partition whose last snapshot is older than its interval policy."""
        frequency = self.config.broker_deduplication_snapshot_frequency_seconds
        if frequency <= 0:
            return
        while True:
            await asyncio.sleep(frequency)
            for partition in self.topics.all_partitions():
                interval = self.policies.resolve(partition.topic).deduplication_snapshot_interval_seconds
                partition.dedup.snapshot_if_due(interval_seconds=interval)

    async def _dedup_purge_loop(self) -> None:
        """Drop producers idle for longer than the inactivity timeout (checked every timeout/3, as Pulsar does)."""
        timeout = (self.config.test_dedup_inactivity_timeout_seconds
                   or self.config.broker_deduplication_producer_inactivity_timeout_minutes * 60)
        while True:
            await asyncio.sleep(max(1.0, timeout / 3))
            for partition in self.topics.all_partitions():
                partition.dedup.purge_inactive(timeout)

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        if self.cluster is not None:  # ownership stays as it is while everything closes
            await self.cluster.stop_following()
        await self._close_listeners()
        for connection in list(self._connections):
            connection.abort()
        await asyncio.sleep(0)  # their transports report the close
        await self.replication.stop()
        if self.transactions is not None:
            await self.transactions.stop()
        await self.groups.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        await self.topics.close()
        self._release_data_dir()
        log.info("kop stopped")

    def _release_data_dir(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


async def _listen(starting: Awaitable[None], host: str, port: int, purpose: str) -> None:
    """Start serving a bound socket. Its listen() fails only when another process bound the same port meanwhile
    (SO_REUSEADDR lets sockets that do not listen yet share a port) and listened first."""
    try:
        await starting
    except OSError as exc:
        raise bind_failure(exc, host, port, purpose) from None
