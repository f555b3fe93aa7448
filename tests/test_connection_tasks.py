"""A coroutine handler runs in a task from its first step: what it calls may need one. asyncio.timeout does (so does
asyncio.wait_for since Python 3.12), and asyncpg's connect enters one when its pool opens a connection: the cluster
soak met it as CreateTopics closing its connection with "Timeout should be used inside a task" while a handler's
first step ran outside any task."""
import asyncio
import dataclasses

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from integration.idem_raw import RawKafka
from kop.broker import Broker
from kop.config import BrokerConfig

METADATA_KEY = 3
pytestmark = pytest.mark.timeout(30)


async def test_a_handler_that_enters_a_timeout_in_its_first_step_is_answered(tmp_path):
    broker = Broker(BrokerConfig(port=0, admin_port=0, fsync=False, data_dir=str(tmp_path)))
    await broker.start()
    try:
        route = broker.api_router.routes[METADATA_KEY]
        in_task = []

        async def metadata(ctx, request):
            in_task.append(asyncio.current_task() is not None)
            async with asyncio.timeout(10):  # as asyncpg's connect, and wait_for on Python 3.12
                return await route.handler(ctx, request)

        broker.api_router.routes[METADATA_KEY] = dataclasses.replace(route, handler=metadata, is_async=True)

        def ask() -> list:
            with RawKafka(broker.port) as kafka:
                request = MetadataRequest[1](topics=None)
                return [kafka.call(request, MetadataResponse, 1) for _ in range(3)]

        answers = await asyncio.to_thread(ask)
        assert [len(a.brokers) for a in answers] == [1, 1, 1]
        assert in_task == [True, True, True]
    finally:
        await broker.stop()
