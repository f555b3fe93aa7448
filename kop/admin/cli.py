"""`kop admin`: pulsar-admin's deduplication commands over kop's admin REST API.

    kop admin [--admin-url URL] namespaces set-deduplication public/default --enable
    kop admin topics get-deduplication my-topic --applied
    kop admin topics stats-internal my-topic

Answers are printed as JSON; set and remove print nothing, as pulsar-admin does. Errors go to stderr with exit 1.
"""
import argparse
import json
import os
import sys
from collections.abc import Callable

from kop.admin.client import (DEFAULT_ADMIN_URL, AdminClient, AdminError, namespace_resource, namespace_topics,
                              topic_resource)

# policy command suffix -> REST path segment, per level (Pulsar names the topic-level flag differently)
NAMESPACE_POLICIES = {"deduplication": "deduplication", "deduplication-snapshot-interval": "deduplicationSnapshotInterval"}
TOPIC_POLICIES = {"deduplication": "deduplicationEnabled", "deduplication-snapshot-interval": "deduplicationSnapshotInterval"}

Action = Callable[[AdminClient, argparse.Namespace], object]
QUIET = object()  # an action's result when there is nothing to print


def add_admin_parser(commands: argparse._SubParsersAction) -> None:
    admin = commands.add_parser("admin", help="manage policies and read stats over the admin REST API",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    admin.add_argument("--admin-url", default=os.environ.get("KOP_ADMIN_URL", DEFAULT_ADMIN_URL),
                       help=f"the broker's admin API (default $KOP_ADMIN_URL or {DEFAULT_ADMIN_URL})")
    admin.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer")
    groups = admin.add_subparsers(dest="admin_group", required=True)
    _add_policy_commands(groups.add_parser("namespaces", help="namespace policies"), "namespace", NAMESPACE_POLICIES)
    topics = groups.add_parser("topics", help="topic policies, stats and listing")
    topic_commands = _add_policy_commands(topics, "topic", TOPIC_POLICIES)
    _add_topic_commands(topic_commands)


def run_admin(args: argparse.Namespace) -> int:
    client = AdminClient(args.admin_url, timeout=args.timeout)
    try:
        result = args.admin_action(client, args)
    except (AdminError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if result is not QUIET:
        print(json.dumps(result, indent=2, sort_keys=True))
    return 0


# ---- commands


def _add_policy_commands(group: argparse.ArgumentParser, level: str,
                         policies: dict[str, str]) -> argparse._SubParsersAction:
    commands = group.add_subparsers(dest="admin_command", required=True)
    metavar = "tenant/namespace" if level == "namespace" else "TOPIC"

    def resource(args: argparse.Namespace, segment: str) -> str:
        build = namespace_resource if level == "namespace" else topic_resource
        return build(args.target, segment)

    for suffix, segment in policies.items():
        def get(client: AdminClient, args: argparse.Namespace, segment: str = segment) -> object:
            query = {"applied": True} if getattr(args, "applied", False) else {}
            return client.get(resource(args, segment), **query)

        def set_(client: AdminClient, args: argparse.Namespace, segment: str = segment) -> object:
            value = args.enable if segment != "deduplicationSnapshotInterval" else args.interval
            client.post(resource(args, segment), value)
            return QUIET

        def remove(client: AdminClient, args: argparse.Namespace, segment: str = segment) -> object:
            client.delete(resource(args, segment))
            return QUIET

        getter = _command(commands, f"get-{suffix}", get, metavar, f"show the {level}'s {suffix} policy")
        getter.add_argument("--applied", "-ap", action="store_true",
                            help="the value in force (topic -> namespace -> broker), not only this level's")
        setter = _command(commands, f"set-{suffix}", set_, metavar, f"set the {level}'s {suffix} policy")
        if suffix == "deduplication":
            choice = setter.add_mutually_exclusive_group(required=True)
            choice.add_argument("--enable", "-e", dest="enable", action="store_true", default=None)
            choice.add_argument("--disable", "-d", dest="enable", action="store_false")
        else:
            setter.add_argument("--interval", "-i", type=int, required=True, help="seconds (0 = no time snapshots)")
        _command(commands, f"remove-{suffix}", remove, metavar,
                 f"remove the {level}'s {suffix} policy (fall back to the next level)")
    return commands


def _add_topic_commands(commands: argparse._SubParsersAction) -> None:
    _command(commands, "stats", lambda c, a: c.get(topic_resource(a.target, "stats")), "TOPIC",
             "deduplication status and producers with their last sequence ids")
    _command(commands, "stats-internal", lambda c, a: c.get(topic_resource(a.target, "internalStats")), "TOPIC",
             "ledgers, last confirmed entry and cursors (the pulsar.dedup cursor's properties are the snapshot)")
    _command(commands, "list", lambda c, a: c.get(namespace_topics(a.target)), "tenant/namespace",
             "the partitions of every topic in the namespace")
    _command(commands, "list-partitioned-topics", lambda c, a: c.get(namespace_topics(a.target) + "/partitioned"),
             "tenant/namespace", "the topics in the namespace")


def _command(commands: argparse._SubParsersAction, name: str, action: Action, metavar: str,
             help_: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help_, description=help_)
    parser.add_argument("target", metavar=metavar)
    parser.set_defaults(admin_action=action)
    return parser
