"""The authorizer's decisions and the ACL filters, as Kafka's StandardAuthorizer makes them."""
import asyncio

import pytest

from kop.security.acls import (CLUSTER_NAME, AclBinding, AclFilter, Authorizer, InvalidAcl, Operation, PatternType,
                               Permission, ResourceType)

T, G = ResourceType.TOPIC, ResourceType.GROUP
ALICE = "User:alice"


def binding(name, operation, permission=Permission.ALLOW, pattern=PatternType.LITERAL, principal=ALICE,
            resource_type=T, host="*"):
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


@pytest.fixture
def authorizer(tmp_path):
    authorizer = Authorizer(str(tmp_path), "User:root", allow_if_no_acl=False, enabled=True, durable=False)
    asyncio.run(authorizer.add([binding("orders-", Operation.WRITE, pattern=PatternType.PREFIXED),
                                binding("orders-secret", Operation.ALL, Permission.DENY),
                                binding("public", Operation.READ, principal="User:*"),
                                binding("*", Operation.READ, resource_type=G),
                                binding("local", Operation.READ, host="10.0.0.1")]))
    return authorizer


@pytest.mark.parametrize("principal, operation, resource_type, name, allowed", [
    (ALICE, Operation.WRITE, T, "orders-1", True),
    (ALICE, Operation.DESCRIBE, T, "orders-1", True),  # implied by WRITE
    (ALICE, Operation.READ, T, "orders-1", False),  # WRITE does not imply READ
    (ALICE, Operation.WRITE, T, "orders-secret", False),  # DENY wins over the prefix's ALLOW
    (ALICE, Operation.DESCRIBE, T, "orders-secret", False),  # DENY ALL
    (ALICE, Operation.WRITE, T, "order", False),  # not under the prefix
    ("User:bob", Operation.READ, T, "public", True),  # User:* names everyone
    ("User:bob", Operation.WRITE, T, "orders-1", False),
    (ALICE, Operation.READ, G, "any-group", True),  # the literal * names every group
    (ALICE, Operation.READ, T, "local", False),  # an ACL for another host
    (ALICE, Operation.READ, T, "unnamed", False),  # no ACL at all: allow.everyone.if.no.acl.found=false
    ("User:root", Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME, True),  # a super user
])
def test_decisions(authorizer, principal, operation, resource_type, name, allowed):
    assert authorizer.authorize(principal, "127.0.0.1", operation, resource_type, name) is allowed


def test_what_no_acl_names_follows_allow_everyone_if_no_acl_found(tmp_path):
    open_broker = Authorizer(str(tmp_path), "", allow_if_no_acl=True, enabled=True, durable=False)
    asyncio.run(open_broker.add([binding("named", Operation.READ)]))
    assert open_broker.authorize("User:bob", "h", Operation.WRITE, T, "unnamed")
    assert not open_broker.authorize("User:bob", "h", Operation.READ, T, "named")  # named: the ACLs decide
    disabled = Authorizer(str(tmp_path), "", allow_if_no_acl=False, enabled=False)
    assert disabled.authorize("User:bob", "h", Operation.WRITE, T, "named")


def test_filters_any_match_and_literal(authorizer):
    def names(**fields):
        base = dict(resource_type=ResourceType.ANY, resource_name=None, pattern_type=PatternType.ANY, principal=None,
                    host=None, operation=Operation.ANY, permission=Permission.ANY)
        return sorted(acl.resource_name for acl in authorizer.matching(AclFilter(**{**base, **fields})))
    assert names() == ["*", "local", "orders-", "orders-secret", "public"]
    assert names(resource_type=T, resource_name="orders-secret", pattern_type=PatternType.MATCH) == [
        "orders-", "orders-secret"]
    assert names(pattern_type=PatternType.PREFIXED) == ["orders-"]
    assert names(permission=Permission.DENY) == ["orders-secret"]
    assert names(resource_type=G, resource_name="x", pattern_type=PatternType.MATCH) == ["*"]


def test_acls_survive_a_reload(authorizer, tmp_path):
    again = Authorizer(str(tmp_path), "", allow_if_no_acl=False, enabled=True)
    again.load()
    everything = AclFilter(ResourceType.ANY, None, PatternType.ANY, None, None, Operation.ANY, Permission.ANY)
    assert again.matching(everything) == authorizer.matching(everything)
    assert len(asyncio.run(again.delete(everything))) == 5 and again.matching(everything) == []


@pytest.mark.parametrize("acl, message", [
    (binding("x", Operation.ANY), "operation"), (binding("x", Operation.READ, Permission.ANY), "permission"),
    (binding("x", Operation.READ, pattern=PatternType.MATCH), "pattern type"),
    (binding("x", Operation.READ, principal="alice"), "TYPE:NAME"),
    (binding("other", Operation.ALTER, resource_type=ResourceType.CLUSTER), "resource name"),
    (binding("x", Operation.READ, resource_type=ResourceType.ANY), "resource type")])
def test_bindings_kafka_refuses_are_refused(authorizer, acl, message):
    with pytest.raises(InvalidAcl, match=message):
        asyncio.run(authorizer.add([acl]))
