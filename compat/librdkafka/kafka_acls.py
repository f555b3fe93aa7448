"""`kafka-acls.sh` for librdkafka's tests (`compat/librdkafka/kafka_path/bin/kafka-acls.sh` runs this).

librdkafka's 0109, 0115 and 0119 run `$KAFKA_PATH/bin/kafka-acls.sh --bootstrap-server $BROKERS --add
--allow-principal|--deny-principal P --operation OP --allow-host|--deny-host H --topic T` to grant or deny a topic.
Against a Kafka 3.x broker the real script sends CreateAcls (and DeleteAcls for --remove), so this does the same with
kafka-python's admin client, for that subset; options it does not know are refused (exit 1, as AclCommand).
"""
from __future__ import annotations

import argparse
import sys

from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                         ResourcePattern, ResourcePatternFilter, ResourceType)

OPERATIONS = {op.name.replace("_", "").lower(): op for op in ACLOperation}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kafka-acls.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", required=True)
    actions = parser.add_mutually_exclusive_group(required=True)
    actions.add_argument("--add", action="store_true")
    actions.add_argument("--remove", action="store_true")
    parser.add_argument("--allow-principal", action="append", default=[])
    parser.add_argument("--deny-principal", action="append", default=[])
    parser.add_argument("--allow-host", action="append", default=[])
    parser.add_argument("--deny-host", action="append", default=[])
    parser.add_argument("--operation", action="append", default=[], required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--force", action="store_true")
    return parser.parse_args(argv)


def bindings(args: argparse.Namespace) -> list[ACL]:
    pattern = ResourcePattern(ResourceType.TOPIC, args.topic, ACLResourcePatternType.LITERAL)
    out = []
    for principals, hosts, permission in ((args.allow_principal, args.allow_host, ACLPermissionType.ALLOW),
                                          (args.deny_principal, args.deny_host, ACLPermissionType.DENY)):
        for principal in principals:
            for host in hosts or ["*"]:
                for operation in args.operation:
                    op = OPERATIONS.get(operation.replace("_", "").lower())
                    if op is None:
                        raise SystemExit(f"kafka-acls.sh: unknown operation {operation}")
                    out.append(ACL(principal, host, op, permission, pattern))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap_server, request_timeout_ms=30_000)
    try:
        acls = bindings(args)
        if args.add:
            result = admin.create_acls(acls)
            if result["failed"]:
                print(f"Error while adding ACLs: {result['failed']}", file=sys.stderr)
                return 1
        else:
            for acl in acls:
                admin.delete_acls([ACLFilter(acl.principal, acl.host, acl.operation, acl.permission_type,
                                             ResourcePatternFilter(ResourceType.TOPIC, args.topic,
                                                                   ACLResourcePatternType.LITERAL))])
        print(f"{'Adding' if args.add else 'Removing'} ACLs for resource `ResourcePattern(resourceType=TOPIC, "
              f"name={args.topic}, patternType=LITERAL)`")
        return 0
    finally:
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
