"""Users, ACLs, quotas and geo clusters on the PostgreSQL engine, against a real server: one broker's change is read
by another at its next heartbeat, changes made at once through two brokers both hold, a failed write changes
nothing, and a broker's own file is copied only into a database that was never set up."""
import asyncio

import asyncpg
import pytest

from kop.ledger.postgres import PgStore
from kop.replication.clusters import ClusterExists, ClusterRegistry, check_cluster
from kop.security.acls import AclBinding, AclFilter, Authorizer, Operation, PatternType, Permission, ResourceType
from kop.security.quotas import FETCH_RATE, PRODUCE_RATE, QuotaBook
from kop.security.users import UserStore
from kop.shared_book import NotStored


@pytest.fixture
async def stores(postgres_url):
    """Two brokers' connections to one database."""
    opened = [await PgStore(postgres_url).open(), await PgStore(postgres_url).open()]
    yield opened
    for store in opened:
        await store.close()


def acl(name: str, principal: str = "User:alice") -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, PatternType.LITERAL, principal, "*", Operation.READ,
                      Permission.ALLOW)


EVERY_ACL = AclFilter(ResourceType.ANY, None, PatternType.ANY, None, None, Operation.ANY, Permission.ANY)


async def heartbeat(book, store: PgStore) -> bool:
    return await book.reload(await store.record_versions())


async def test_a_user_set_through_one_broker_signs_in_on_another_after_its_heartbeat(tmp_path, stores):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first, second = UserStore(str(tmp_path / "a"), durable=False), UserStore(str(tmp_path / "b"), durable=False)
    await first.share_through(stores[0])
    await second.share_through(stores[1])
    await first.set_password("alice", "wonderland")
    assert not second.check_password("alice", "wonderland")  # not read yet
    assert await heartbeat(second, stores[1])
    assert second.check_password("alice", "wonderland")
    assert not await heartbeat(second, stores[1])  # nothing changed since: nothing read
    await second.delete("alice", "SCRAM-SHA-512")
    assert await heartbeat(first, stores[0])
    assert [c.mechanism for c in first.users()["alice"]] == ["SCRAM-SHA-256"]
    assert not (tmp_path / "a" / "users.json").exists()  # the database holds them, not the data directory


async def test_acls_created_at_once_through_two_brokers_all_hold(tmp_path, stores):
    brokers = [Authorizer(str(tmp_path), "", allow_if_no_acl=False, enabled=True, durable=False) for _ in stores]
    for authorizer, store in zip(brokers, stores):
        await authorizer.share_through(store)
    await asyncio.gather(*(authorizer.add([acl(f"t{i}-{n}") for n in range(5)])
                           for i, authorizer in enumerate(brokers)))
    for authorizer, store in zip(brokers, stores):
        await heartbeat(authorizer, store)
        assert len(authorizer.matching(EVERY_ACL)) == 10
        assert authorizer.authorize("User:alice", "h", Operation.READ, ResourceType.TOPIC, "t1-4")
    assert len(await brokers[0].delete(EVERY_ACL)) == 10
    await heartbeat(brokers[1], stores[1])
    assert not brokers[1].authorize("User:alice", "h", Operation.READ, ResourceType.TOPIC, "t1-4")


async def test_two_keys_of_one_quota_entity_set_through_two_brokers_both_hold(tmp_path, stores):
    books = [QuotaBook(str(tmp_path), durable=False) for _ in stores]
    for book, store in zip(books, stores):
        await book.share_through(store)
    entity = (("user", "u"),)
    await books[0].alter(entity, {PRODUCE_RATE: 100.0})
    await books[1].alter(entity, {FETCH_RATE: 200.0})  # before it read the first change
    for book, store in zip(books, stores):
        await heartbeat(book, store)
        assert book.entries() == {entity: {PRODUCE_RATE: 100.0, FETCH_RATE: 200.0}}
    await books[1].alter(entity, {PRODUCE_RATE: None, FETCH_RATE: None})
    await heartbeat(books[0], stores[0])
    assert books[0].entries() == {} and books[0].limit("u", "c", PRODUCE_RATE) is None


async def test_a_cluster_created_through_one_broker_cannot_be_created_again_through_another(tmp_path, stores):
    registries = [ClusterRegistry(str(tmp_path), durable=False) for _ in stores]
    for registry, store in zip(registries, stores):
        await registry.share_through(store)
    await registries[0].create(check_cluster("east", "127.0.0.1:9092"))
    with pytest.raises(ClusterExists):  # judged by the database, not by its view of a heartbeat ago
        await registries[1].create(check_cluster("east", "127.0.0.1:9093"))
    assert registries[1].get("east").broker_url == "127.0.0.1:9092"
    await registries[1].delete("east")
    await heartbeat(registries[0], stores[0])
    assert registries[0].get("east") is None


async def test_a_brokers_file_is_copied_only_into_a_database_never_set_up(tmp_path, stores):
    (tmp_path / "moving").mkdir(), (tmp_path / "late").mkdir()
    moving = UserStore(str(tmp_path / "moving"), durable=False)
    await moving.set_password("alice", "wonderland")  # in its users.json
    late = UserStore(str(tmp_path / "late"), durable=False)
    await late.set_password("mallory", "secret")
    moving.load(), late.load()
    await moving.share_through(stores[0])  # the first broker on the database: its users come along
    await moving.delete("alice")  # the cluster has no user now, but it was set up
    await late.share_through(stores[1])
    assert late.users() == {} and moving.users() == {}  # mallory was not copied into the set-up database


async def test_a_change_the_database_refuses_changes_nothing(tmp_path, stores, postgres_url):
    authorizer = Authorizer(str(tmp_path), "", allow_if_no_acl=False, enabled=True, durable=False)
    await authorizer.share_through(stores[0])
    await authorizer.add([acl("kept")])
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("ALTER TABLE kop_record ADD CONSTRAINT no_more CHECK (key NOT LIKE '%refused%') NOT VALID")
        with pytest.raises(NotStored):
            await authorizer.add([acl("refused")])
    finally:
        await conn.execute("ALTER TABLE kop_record DROP CONSTRAINT no_more")
        await conn.close()
    assert [a.resource_name for a in authorizer.matching(EVERY_ACL)] == ["kept"]
