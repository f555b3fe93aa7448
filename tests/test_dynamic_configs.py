"""Dynamic broker configs (kop/dynamic) without a broker process: the checks a level passes, the settings in force
over the static ones, what is stored in the data directory and read back, and on PostgreSQL what several brokers
share and change at once."""
import asyncio
import logging
import os

import pytest

from kop.config import BrokerConfig
from kop.dynamic import DEFAULT_LEVEL, BrokerConfigError, BrokerSettings
from kop.dynamic.keys import DYNAMIC_FIELDS, STORED_ONLY, check_level
from kop.dynamic.store import DynamicConfigStore
from kop.handlers.configs import BROKER_SETTINGS_BY_NAME
from kop.ledger.postgres import PgStore
from protocol.errors import ErrorCode


def settings_in(directory, **static) -> BrokerSettings:
    os.makedirs(directory, exist_ok=True)
    settings = BrokerSettings(BrokerConfig(data_dir=str(directory), **static), frozenset(static))
    settings.load()
    return settings


def setting(key: str, value: str):
    return lambda configs: {**configs, key: value}


def test_every_key_that_changes_at_run_time_is_described():
    assert set(DYNAMIC_FIELDS) <= set(BROKER_SETTINGS_BY_NAME)
    assert not set(STORED_ONLY) & set(BROKER_SETTINGS_BY_NAME)


def test_a_level_is_stored_in_one_spelling():
    assert check_level({"auto.create.topics.enable": " FALSE", "num.partitions": "+3",
                        "sasl.kerberos.ticket.renew.window.factor": "0.75"}, per_broker=True) == \
        {"auto.create.topics.enable": "false", "num.partitions": "3", "sasl.kerberos.ticket.renew.window.factor": "0.75"}


@pytest.mark.parametrize("configs, per_broker, message", [
    ({"data.dir": "/elsewhere"}, True, "Cannot update these configs dynamically: data.dir"),
    ({"sasl.kerberos.kinit.cmd": "kinit"}, False, "broker id must be specified"),
    ({"log.retention.ms": "-2"}, False, "Invalid value -2 for configuration log.retention.ms"),
    ({"sasl.kerberos.min.time.before.relogin": "soon"}, True, "Invalid value soon"),
    ({"sasl.kerberos.ticket.renew.jitter": "nan"}, True, "not a finite number"),
])
def test_a_level_kafka_refuses_is_refused(configs, per_broker, message):
    with pytest.raises(BrokerConfigError) as refused:
        check_level(configs, per_broker)
    assert refused.value.code == ErrorCode.INVALID_REQUEST and message in str(refused.value)


async def test_a_change_is_stored_told_to_subscribers_and_read_back_by_the_next_start(tmp_path):
    settings = settings_in(tmp_path, num_partitions=2)
    told = []

    async def subscriber(config):
        told.append(config.num_partitions)
    settings.subscribe(subscriber)
    await settings.alter(DEFAULT_LEVEL, setting("num.partitions", "5"), validate_only=False, principal="User:a")
    await settings.alter("1", setting("message.max.bytes", "2000"), validate_only=False, principal="User:a")
    assert told == [5, 5] and settings.current.message_max_bytes == 2000
    again = settings_in(tmp_path, num_partitions=2)
    assert (again.current.num_partitions, again.current.message_max_bytes) == (5, 2000)
    assert again.level(DEFAULT_LEVEL) == {"num.partitions": "5"}


async def test_validate_only_and_refused_changes_store_nothing(tmp_path):
    settings = settings_in(tmp_path)
    await settings.alter("1", setting("num.partitions", "5"), validate_only=True, principal="User:a")
    assert not os.path.exists(settings.store.path) and settings.current.num_partitions == 1
    await settings.alter("1", setting("num.partitions", "4"), validate_only=False, principal="User:a")
    stored = open(settings.store.path, "rb").read()
    with pytest.raises(BrokerConfigError):  # breaks a rule with the static settings
        await settings.alter("1", setting("group.min.session.timeout.ms", "4000000"), validate_only=False,
                             principal="User:a")
    with pytest.raises(BrokerConfigError):  # another broker's level
        await settings.alter("2", setting("num.partitions", "3"), validate_only=False, principal="User:a")
    assert open(settings.store.path, "rb").read() == stored and settings.current.num_partitions == 4


async def test_a_failed_write_changes_nothing_in_force(tmp_path):
    settings = settings_in(tmp_path)
    os.mkdir(settings.store.path + ".tmp")  # the atomic replace cannot write its temporary file
    with pytest.raises(BrokerConfigError) as failed:
        await settings.alter("1", setting("num.partitions", "5"), validate_only=False, principal="User:a")
    assert failed.value.code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert settings.current.num_partitions == 1 and settings.store.levels == {}


async def test_stored_configs_that_no_longer_apply_are_left_out_with_an_error_logged(tmp_path, caplog):
    """After an upgrade or a change of the properties file: a key no longer dynamic, a value no longer accepted, or
    levels that together break a rule with the static settings. The rest still applies."""
    store = DynamicConfigStore(str(tmp_path), durable=False)
    await store.update(DEFAULT_LEVEL, lambda _: {"group.min.session.timeout.ms": "20000", "num.partitions": "3"})
    await store.update("1", lambda _: {"broker.id": "7", "message.max.bytes": "0", "group.max.size": "9"})
    with caplog.at_level(logging.ERROR, logger="kop.dynamic.settings"):
        settings = settings_in(tmp_path, group_max_session_timeout_ms=10000)
    config = settings.current
    assert (config.node_id, config.message_max_bytes, config.group_max_size, config.num_partitions) == \
        (1, BrokerConfig().message_max_bytes, 9, 3)
    assert config.group_min_session_timeout_ms == BrokerConfig().group_min_session_timeout_ms
    logged = caplog.text
    assert "broker.id=7 of broker 1 ignored" in logged and "message.max.bytes=0 of broker 1 ignored" in logged
    assert "group.min.session.timeout.ms=20000 of the cluster-wide default not applied" in logged


# ---- PostgreSQL: the levels several brokers share

@pytest.fixture
async def stores(postgres_url):
    stores = [await PgStore(postgres_url).open() for _ in range(2)]
    yield stores
    for store in stores:
        await store.close()


async def test_changes_from_two_brokers_at_once_are_all_kept(tmp_path, stores):
    """Each change reads, changes and writes the level under its row lock: none overwrites another's."""
    brokers = [settings_in(tmp_path / f"b{node}", node_id=node) for node in (1, 2)]
    for broker, store in zip(brokers, stores):
        await broker.share_through(store)
    changes = [
        {"num.partitions": "3", "group.max.size": "10", "offset.metadata.max.bytes": "100",
         "transaction.max.timeout.ms": "60000", "max.connections": "500", "log.segment.bytes": "1000000"},
        {"message.max.bytes": "2000000", "max.partitions.per.topic": "100", "group.initial.rebalance.delay.ms": "10",
         "log.retention.ms": "100000", "log.retention.bytes": "1000000", "log.roll.ms": "100000"}]
    await asyncio.gather(*(broker.alter(DEFAULT_LEVEL, setting(key, value), False, "User:a")
                           for broker, configs in zip(brokers, changes) for key, value in configs.items()))
    for broker in brokers:
        await broker.reload()
        assert broker.level(DEFAULT_LEVEL) == {**changes[0], **changes[1]}
        assert (broker.current.num_partitions, broker.current.ledger_max_age_ms) == (3, 100000)


async def test_a_broker_reads_the_others_changes_and_its_own_level_only(tmp_path, stores):
    one, two = settings_in(tmp_path / "one", node_id=1), settings_in(tmp_path / "two", node_id=2)
    await one.alter("1", setting("num.partitions", "6"), False, "User:a")  # in its file, before the database
    await one.share_through(stores[0])  # the database has none: the file's come along
    await two.share_through(stores[1])
    assert (one.current.num_partitions, two.current.num_partitions) == (6, 1)  # broker 1's level is its own
    await two.alter(DEFAULT_LEVEL, setting("message.max.bytes", "3000"), False, "User:a")
    assert one.current.message_max_bytes != 3000
    await one.reload()  # its next heartbeat
    assert (one.current.message_max_bytes, two.current.message_max_bytes) == (3000, 3000)
    three = settings_in(tmp_path / "three", node_id=3)
    await three.alter(DEFAULT_LEVEL, setting("num.partitions", "9"), False, "User:a")  # in its file
    await three.share_through(stores[1])  # the database has levels: the file's are not copied
    assert three.level(DEFAULT_LEVEL) == {"message.max.bytes": "3000"}


class ReadThenWait:
    """The database's records (a real PgStore), whose next read pauses after reading until released: a heartbeat's
    reload caught between reading the levels and putting them in force."""

    def __init__(self, store: PgStore) -> None:
        self._store = store
        self.read, self.release = asyncio.Event(), asyncio.Event()
        self.pause_next = False

    async def records(self, kind: str) -> dict[str, bytes]:
        found = await self._store.records(kind)
        if self.pause_next:
            self.pause_next = False
            self.read.set()
            await asyncio.wait_for(self.release.wait(), 10)
        return found

    async def put_record(self, kind: str, key: str, value: bytes) -> None:
        await self._store.put_record(kind, key, value)

    async def update_record(self, kind, key, change):
        return await self._store.update_record(kind, key, change)


async def test_a_reload_read_before_a_change_does_not_undo_it(tmp_path, stores):
    """A heartbeat's reload that read the levels before this broker changed one must not put the old level back
    in force once the change is acknowledged."""
    broker = settings_in(tmp_path, node_id=1)
    records = ReadThenWait(stores[0])
    await broker.share_through(records)
    await broker.alter(DEFAULT_LEVEL, setting("num.partitions", "2"), False, "User:a")
    records.pause_next = True
    reload = asyncio.create_task(broker.reload())
    await asyncio.wait_for(records.read.wait(), 10)  # the reload has read num.partitions=2
    change = asyncio.create_task(broker.alter(DEFAULT_LEVEL, setting("num.partitions", "3"), False, "User:a"))
    await asyncio.wait({change}, timeout=1)  # the change goes as far as it can while the reload waits
    records.release.set()
    await asyncio.gather(reload, change)
    assert broker.current.num_partitions == 3 and broker.level(DEFAULT_LEVEL) == {"num.partitions": "3"}


async def test_another_brokers_change_read_by_a_refused_or_validate_only_change_is_put_in_force(tmp_path, stores):
    one, two = settings_in(tmp_path / "one", node_id=1), settings_in(tmp_path / "two", node_id=2)
    await one.share_through(stores[0])
    await two.share_through(stores[1])
    await two.alter(DEFAULT_LEVEL, setting("message.max.bytes", "3000"), False, "User:a")
    await one.alter("1", setting("num.partitions", "5"), validate_only=True, principal="User:a")  # reads the levels
    with pytest.raises(BrokerConfigError):
        await one.alter("1", setting("num.partitions", "0"), False, "User:a")
    await one.reload()  # its next heartbeat
    assert (one.current.message_max_bytes, one.current.num_partitions) == (3000, 1)
