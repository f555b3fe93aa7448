"""The broker: configuration, storage, the request router and the TCP listener, as one object that a test can start
twice in one process."""
import asyncio
import contextlib
import logging
import os
import time

from kop import handlers
from kop.admin.server import AdminServer
from kop.byte_budget import ByteBudget
from kop.config import BrokerConfig
from kop.connection import Connection
from kop.groups import GroupCoordinator
from kop.policies import PolicyBook
from kop.producer_ids import ProducerIdAllocator
from kop.topics import TopicManager, deletes_by_retention

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.policies = PolicyBook(config)
        self.topics = TopicManager(config, self.policies)
        self.groups = GroupCoordinator(config, self.topics)
        self.api_router = handlers.build_api_router()
        self.producer_ids: ProducerIdAllocator | None = None
        self.started_ms = int(time.time() * 1000)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()
        self.request_bytes = ByteBudget(config.queued_max_request_bytes)  # unanswered request bytes, all connections
        self._background: list[asyncio.Task] = []
        self.port = config.port
        self._admin: AdminServer | None = None
        self.admin_port = 0  # the admin HTTP port bound, 0 when the admin API is off

    @property
    def advertised_port(self) -> int:
        return self.config.advertised_port or self.port

    async def start(self) -> None:
        os.makedirs(self.config.data_dir, exist_ok=True)
        self.producer_ids = ProducerIdAllocator(os.path.join(self.config.data_dir, "producer-ids"),
                                                durable=self.config.fsync)
        self.policies.load()
        await self.topics.load_all()
        self.groups.start()  # needs the topics: groups are found from their partitions' cursors
        if self.config.admin_port != 0:  # first, so a busy admin port stops the start before clients connect
            self._admin = AdminServer(self)
            await self._admin.start()
            self.admin_port = self._admin.port
        self._server = await asyncio.start_server(self._on_client, self.config.host, self.config.port,
                                                  backlog=1024, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        self._background.append(asyncio.create_task(self._retention_loop()))
        self._background.append(asyncio.create_task(self._dedup_snapshot_loop()))
        self._background.append(asyncio.create_task(self._dedup_purge_loop()))
        log.info("kop listening on %s:%d (data in %s)", self.config.host, self.port, self.config.data_dir)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.config.max_connections:
            log.warning("refusing a connection: %d open (max_connections)", len(self._connections))
            writer.close()
            return
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            # stop() cancels every connection; asyncio would log each one as an error
            with contextlib.suppress(asyncio.CancelledError):
                await Connection(self, reader, writer).run()
        finally:
            self._connections.discard(task)

    async def _retention_loop(self) -> None:
        interval = max(1.0, self.config.retention_check_interval_ms / 1000)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.enforce_retention()
            except Exception:
                log.exception("retention check failed")

    async def enforce_retention(self) -> None:
        now = int(time.time() * 1000)
        for topic in list(self.topics.topics.values()):
            if not deletes_by_retention(topic.configs):
                continue
            retention_ms = int(topic.configs.get("retention.ms", self.config.retention_ms))
            retention_bytes = int(topic.configs.get("retention.bytes", self.config.retention_bytes))
            for partition in topic.partitions:
                await partition.enforce_retention(now, retention_ms, retention_bytes)

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
        if self._admin is not None:
            await self._admin.stop()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.groups.stop()
        await self.topics.close()
        log.info("kop stopped")
