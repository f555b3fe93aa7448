"""Policies on the PostgreSQL engine, against a real server: kept in the database, read by every broker of it, and
copied from a broker's file into a database that holds none yet."""
import asyncio

import pytest

from kop.config import BrokerConfig
from kop.ledger.postgres import PgStore
from kop.policies import PolicyBook


@pytest.fixture
async def store(postgres_url):
    store = await PgStore(postgres_url).open()
    yield store
    await store.close()


def book(tmp_path, name: str, **config) -> PolicyBook:
    (tmp_path / name).mkdir()
    policies = PolicyBook(BrokerConfig(data_dir=str(tmp_path / name), fsync=False, **config))
    policies.load()
    return policies


async def test_a_policy_one_broker_sets_is_read_by_another_and_a_file_is_copied_only_into_an_empty_database(
        tmp_path, store):
    moving = book(tmp_path, "moving")
    await moving.set("topic", moving.topic_key("orders"), "deduplication_enabled", False)  # in its file
    await moving.share_through(store)  # the database has none: the file's come along
    assert not moving.resolve("orders").deduplication_enabled
    other = book(tmp_path, "other", broker_deduplication_snapshot_interval_seconds=30)
    await other.set("namespace", "public/default", "deduplication_snapshot_interval_seconds", 60)  # its file
    await other.share_through(store)  # the database has policies: its file's are not copied
    assert not other.resolve("orders").deduplication_enabled  # the moving broker's, read from the database
    assert other.resolve("orders").deduplication_snapshot_interval_seconds == 30  # its file's ignored
    await other.set("namespace", "public/default", "deduplication_enabled", False)
    assert not await other.reload()  # its own change: nothing new
    assert await moving.reload()  # the other broker's change, read at its next heartbeat
    assert not moving.resolve("payments").deduplication_enabled
    await moving.drop_topic("orders")
    assert await other.reload() and other.topics == {}


async def test_a_change_made_while_a_reload_reads_the_database_is_kept(tmp_path, store):
    """A heartbeat's reload and an operator's change at once: the reload's read must not put the old policies back
    in memory after the change was stored (the change would look undone until the next heartbeat)."""
    policies = book(tmp_path, "racing")
    await policies.share_through(store)
    for ttl in range(1, 21):
        reloading = asyncio.ensure_future(policies.reload())
        await asyncio.sleep(0)  # the reload is reading the database now
        await policies.set("namespace", "public/default", "message_ttl_seconds", ttl)
        await reloading
        assert policies.resolve("orders").message_ttl_seconds == ttl, f"change {ttl} undone by the reload"
