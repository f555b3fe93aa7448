"""Kafka's ACLs: bindings of (resource pattern, principal, host, operation, allow/deny), the filters that
DescribeAcls and DeleteAcls match them with, and the authorizer every handler asks through its request context.

The numbers are Kafka's (ResourceType, PatternType, AclOperation, AclPermissionType). A decision: super users may do
everything; else a matching DENY wins, then a matching ALLOW (an ALLOW of READ, WRITE, DELETE or ALTER implies
DESCRIBE, of ALTER_CONFIGS implies DESCRIBE_CONFIGS, as in Kafka); a resource no ACL names at all is allowed only
when allow.everyone.if.no.acl.found is true. ACLs live in `<data>/acls.json`, replaced atomically on every change.
"""
import json
import os
from dataclasses import asdict, dataclass
from enum import IntEnum

from kop.ledger.framed_file import replace_atomically


class ResourceType(IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(IntEnum):
    ANY = 1
    DENY = 2
    ALLOW = 3


NOT_REQUESTED = -(1 << 31)  # authorized operations the client did not ask for: Integer.MIN_VALUE


def operations_bits(operations: set[int]) -> int:
    """Authorized operations as an int32 field holds them (bit n: the operation of code n)."""
    return sum(1 << op for op in operations)


CLUSTER_NAME = "kafka-cluster"  # the one cluster resource's name, as Kafka names it
WILDCARD = "*"
# What each resource type's operations are, as Kafka lists them when it tells a client what it may do (KIP-430)
OPERATIONS_OF = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
                         Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DELETE, Operation.DESCRIBE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.CLUSTER_ACTION,
                           Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE),
}
IMPLIED_BY = {Operation.DESCRIBE: {Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
              Operation.DESCRIBE_CONFIGS: {Operation.ALTER_CONFIGS}}


class InvalidAcl(ValueError):
    """A binding or filter Kafka would refuse (an ANY where a value is needed, a principal without a type)."""


@dataclass(frozen=True, order=True)
class AclBinding:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def check(self) -> None:
        if self.resource_type not in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                                      ResourceType.TRANSACTIONAL_ID):
            raise InvalidAcl(f"resource type {self.resource_type} cannot be bound")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl(f"pattern type {self.pattern_type} cannot be bound (LITERAL or PREFIXED)")
        if self.operation not in set(Operation) - {Operation.ANY}:
            raise InvalidAcl(f"operation {self.operation} cannot be bound")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAcl(f"permission {self.permission} cannot be bound (ALLOW or DENY)")
        if ":" not in self.principal:
            raise InvalidAcl(f"principal {self.principal!r} must be TYPE:NAME, e.g. User:alice")
        if not self.resource_name or (self.resource_type == ResourceType.CLUSTER
                                      and self.resource_name != CLUSTER_NAME):
            raise InvalidAcl(f"resource name {self.resource_name!r} is not valid here")

    def names(self, resource_type: int, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


@dataclass(frozen=True)
class AclFilter:
    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and acl.resource_type != self.resource_type:
            return False
        if not self._pattern_matches(acl):
            return False
        return ((self.principal is None or acl.principal == self.principal)
                and (self.host is None or acl.host == self.host)
                and (self.operation == Operation.ANY or acl.operation == self.operation)
                and (self.permission == Permission.ANY or acl.permission == self.permission))

    def _pattern_matches(self, acl: AclBinding) -> bool:
        if self.pattern_type == PatternType.MATCH:  # every binding that would apply to the named resource
            return self.resource_name is None or acl.names(acl.resource_type, self.resource_name)
        if self.pattern_type != PatternType.ANY and acl.pattern_type != self.pattern_type:
            return False
        return self.resource_name is None or acl.resource_name == self.resource_name


class Authorizer:
    def __init__(self, data_dir: str, super_users: str, allow_if_no_acl: bool, enabled: bool,
                 durable: bool = True) -> None:
        self.path = os.path.join(data_dir, "acls.json")
        self.enabled = enabled
        self._super_users = frozenset(p.strip() for p in super_users.split(";") if p.strip())
        self._allow_if_no_acl = allow_if_no_acl
        self._durable = durable
        self._acls: set[AclBinding] = set()

    def load(self) -> None:
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                self._acls = {AclBinding(**acl) for acl in json.load(f)["acls"]}

    def _save(self) -> None:
        data = json.dumps({"acls": [asdict(acl) for acl in sorted(self._acls)]}, indent=1).encode()
        replace_atomically(self.path, data, durable=self._durable, mode=0o600)

    def is_super_user(self, principal: str) -> bool:
        return principal in self._super_users

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  name: str) -> bool:
        if not self.enabled or principal in self._super_users:
            return True
        naming = [acl for acl in self._acls if acl.names(resource_type, name)]
        if not naming:
            return self._allow_if_no_acl
        applying = [acl for acl in naming if acl.principal in (principal, "User:*") and acl.host in (host, WILDCARD)]
        if any(acl.permission == Permission.DENY and acl.operation in (operation, Operation.ALL) for acl in applying):
            return False
        allowing = {operation, Operation.ALL} | IMPLIED_BY.get(operation, set())
        return any(acl.permission == Permission.ALLOW and acl.operation in allowing for acl in applying)

    def allows_some(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Some resource of the type is open to the principal for the operation (ignoring DENYs of others)."""
        if not self.enabled or principal in self._super_users:
            return True
        return any(acl.resource_type == resource_type and acl.permission == Permission.ALLOW
                   and acl.operation in (operation, Operation.ALL) and acl.principal in (principal, "User:*")
                   and acl.host in (host, WILDCARD) for acl in self._acls)

    def add(self, acls: list[AclBinding]) -> None:
        for acl in acls:
            acl.check()
        self._acls.update(acls)
        self._save()

    def matching(self, acl_filter: AclFilter) -> list[AclBinding]:
        return sorted(acl for acl in self._acls if acl_filter.matches(acl))

    def delete(self, acl_filter: AclFilter) -> list[AclBinding]:
        gone = self.matching(acl_filter)
        if gone:
            self._acls.difference_update(gone)
            self._save()
        return gone
