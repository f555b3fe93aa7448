"""A topic's parsed settings (what the produce path and the ledgers act on) follow its configs: filled in from the
broker's defaults, replaced when AlterConfigs/IncrementalAlterConfigs change the configs, the same after a restart."""
import asyncio

import pytest

from kop.config import BrokerConfig
from kop.policies import PolicyBook
from kop.topics import TopicError, TopicManager, TopicSettings


async def open_topics(data_dir) -> TopicManager:
    config = BrokerConfig(data_dir=str(data_dir), fsync=False, message_max_bytes=5000, ledger_max_bytes=7000)
    policies = PolicyBook(config)
    policies.load()
    topics = TopicManager(config, policies)
    await topics.open_storage()
    await topics.load_all()
    return topics


def test_settings_fill_in_the_broker_defaults():
    defaults = BrokerConfig(message_max_bytes=5000, ledger_max_bytes=7000, ledger_max_age_ms=9000)
    assert TopicSettings.parse({}, defaults) == TopicSettings(max_message_bytes=5000, compacted=False,
                                                              log_append_time=False, segment_bytes=7000,
                                                              segment_ms=9000)
    overrides = {"max.message.bytes": "100", "cleanup.policy": "delete,compact", "segment.ms": "60000",
                 "message.timestamp.type": "LogAppendTime"}
    assert TopicSettings.parse(overrides, defaults) == TopicSettings(max_message_bytes=100, compacted=True,
                                                                     log_append_time=True, segment_bytes=7000,
                                                                     segment_ms=60000)


def test_a_compacted_topics_ledger_rolls_by_max_compaction_lag_when_that_comes_first():
    """Kafka's rule (KIP-354): the current ledger is never cleaned, so max.compaction.lag.ms bounds its age too."""
    defaults = BrokerConfig(ledger_max_age_ms=9000)
    lagged = {"cleanup.policy": "compact", "max.compaction.lag.ms": "4000"}
    assert TopicSettings.parse(lagged, defaults).segment_ms == 4000
    assert TopicSettings.parse({**lagged, "segment.ms": "3000"}, defaults).segment_ms == 3000
    assert TopicSettings.parse({**lagged, "cleanup.policy": "delete"}, defaults).segment_ms == 9000  # not compacted
    assert TopicSettings.parse({"cleanup.policy": "compact"}, defaults).segment_ms == 9000  # Kafka's default: no bound


async def test_settings_follow_altered_configs_and_survive_a_restart(tmp_path):
    topics = await open_topics(tmp_path)
    topic = await topics.create("t", 2, {"max.message.bytes": "100"})
    assert (topic.settings.max_message_bytes, topic.settings.compacted) == (100, False)
    await topics.set_configs("t", {"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime"})
    assert topic.settings == TopicSettings.parse(topic.configs, topics.config)
    assert (topic.settings.max_message_bytes, topic.settings.compacted) == (5000, True)  # back to the default
    assert [p.log_append_time for p in topic.partitions] == [True, True]
    with pytest.raises(TopicError):  # refused: nothing changes
        await topics.set_configs("t", {"max.message.bytes": "big"})
    await topics.set_configs("t", {"max.message.bytes": "300"}, validate_only=True)  # checked, not applied
    assert topic.settings.max_message_bytes == 5000 and topic.settings.compacted
    await topics.close()

    reopened = await open_topics(tmp_path)
    again = reopened.get("t")
    assert again.settings == topic.settings
    assert [p.log_append_time for p in again.partitions] == [True, True]
    await reopened.close()


async def test_a_topic_created_while_the_stored_topics_are_read_is_not_taken_for_one_deleted_elsewhere(tmp_path):
    """A cluster broker's follow step reads the stored topics; a CreateTopics answered meanwhile must survive it."""
    topics = await open_topics(tmp_path)
    read, release = asyncio.Event(), asyncio.Event()
    load = topics.storage.load_metadata

    async def slow_load():
        metas = await load()
        read.set()
        await release.wait()
        return metas

    topics.storage.load_metadata = slow_load
    following = asyncio.ensure_future(topics.sync())
    await read.wait()  # the follow step has read the stored topics, "new" not among them
    creating = asyncio.ensure_future(topics.create("new", 1, {}))
    await asyncio.sleep(0.05)
    release.set()
    await following
    await creating
    assert topics.get("new") is not None
    await topics.sync()  # control: a step that reads after the create keeps it too
    assert topics.get("new") is not None
