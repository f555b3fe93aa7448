"""`kop admin`: pulsar-admin's deduplication commands over kop's admin REST API.

examples:
  kop admin namespaces set-deduplication public/default --enable
  kop admin --admin-url http://127.0.0.1:8081 topics get-deduplication my-topic --applied
  kop admin topics stats-internal my-topic

Answers are printed as JSON; set and remove print what they changed (this level's value before and after, null
where it is not set). Errors go to stderr with exit 1.
"""
import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from kop.admin.client import (DEFAULT_ADMIN_URL, AdminClient, AdminError, basic_credentials, namespace_resource,
                              namespace_topics, topic_resource)
from kop.admin.user_routes import USERS
from kop.security.users import DEFAULT_ITERATIONS


def _enable_arguments(parser: argparse.ArgumentParser) -> None:
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--enable", "-e", dest="enable", action="store_true", default=None, help="turn it on")
    choice.add_argument("--disable", "-d", dest="enable", action="store_false", help="turn it off")


def _interval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", "-i", type=int, required=True, help="seconds (0 = no time-based snapshots)")


@dataclass(frozen=True)
class PolicyCommands:
    """The get-/set-/remove-{suffix} commands of one policy."""

    suffix: str
    namespace_segment: str  # its REST path segment at namespace level
    topic_segment: str  # ... and at topic level (Pulsar names the topic-level flag differently)
    value_arguments: Callable[[argparse.ArgumentParser], None]
    value: Callable[[argparse.Namespace], object]
    example_value: str  # the set- command's arguments in its --help example


POLICIES = (
    PolicyCommands("deduplication", "deduplication", "deduplicationEnabled", _enable_arguments, lambda a: a.enable,
                   "--enable"),
    PolicyCommands("deduplication-snapshot-interval", "deduplicationSnapshotInterval",
                   "deduplicationSnapshotInterval", _interval_arguments, lambda a: a.interval, "--interval 60"),
)

Action = Callable[[AdminClient, argparse.Namespace], object]
QUIET = object()  # an action's result when there is nothing to print


def add_admin_parser(commands: argparse._SubParsersAction) -> None:
    admin = commands.add_parser("admin", help="manage policies and read stats over the admin REST API",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    admin.add_argument("--admin-url", default=os.environ.get("KOP_ADMIN_URL", DEFAULT_ADMIN_URL),
                       help=f"the broker's admin API (default $KOP_ADMIN_URL or {DEFAULT_ADMIN_URL})")
    admin.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer")
    admin.add_argument("--user", default=os.environ.get("KOP_ADMIN_USER"),
                       help="a kop user to authenticate as (default $KOP_ADMIN_USER); the password comes from "
                            "$KOP_ADMIN_PASSWORD or is asked for. $KOP_ADMIN_TOKEN sends the admin token instead")
    groups = admin.add_subparsers(dest="admin_group", required=True, metavar="{namespaces,topics,users}")
    _add_policy_commands(groups.add_parser("namespaces", help="namespace policies", description="Namespace policies.",
                                           epilog=_examples("namespaces", EXAMPLE_NAMESPACE, "set-deduplication "
                                                            "{target} --disable", "get-deduplication {target}"),
                                           formatter_class=argparse.RawDescriptionHelpFormatter), "namespace")
    topics = groups.add_parser("topics", help="topic policies, stats and listing",
                               description="Topic policies, stats and listing.",
                               epilog=_examples("topics", EXAMPLE_TOPIC, "stats {target}",
                                                "get-deduplication {target} --applied", "list public/default"),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    topic_commands = _add_policy_commands(topics, "topic")
    _add_topic_commands(topic_commands)
    _add_user_commands(groups.add_parser("users", help="SASL users (SCRAM-SHA-256/512 and PLAIN)",
                                         description="SASL users: one password per user, kept as SCRAM credentials.",
                                         epilog=_examples("users", "alice", "set {target}", "list",
                                                          "delete {target}"),
                                         formatter_class=argparse.RawDescriptionHelpFormatter))


def run_admin(args: argparse.Namespace) -> int:
    client = AdminClient(args.admin_url, timeout=args.timeout, authorization=_authorization(args))
    try:
        result = args.admin_action(client, args)
    except (AdminError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if result is not QUIET:
        print(json.dumps(result, indent=2, sort_keys=True))
    return 0


# ---- commands

EXAMPLE_NAMESPACE = "public/default"
EXAMPLE_TOPIC = "public/default/orders"  # or just `orders`, in the broker's namespace


def _examples(group: str, target: str, *commands: str) -> str:
    lines = "".join(f"\n  kop admin {group} {command.format(target=target)}" for command in commands)
    return f"example{'s' if len(commands) > 1 else ''}:{lines}"


def _add_policy_commands(group: argparse.ArgumentParser, level: str) -> argparse._SubParsersAction:
    commands = group.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    metavar = "tenant/namespace" if level == "namespace" else "TOPIC"
    target = EXAMPLE_NAMESPACE if level == "namespace" else EXAMPLE_TOPIC
    examples = (f"{level}s", target)
    for policy in POLICIES:
        if level == "namespace":
            def resource(args: argparse.Namespace, segment: str = policy.namespace_segment) -> str:
                return namespace_resource(args.target, segment)
        else:
            def resource(args: argparse.Namespace, segment: str = policy.topic_segment) -> str:
                return topic_resource(args.target, segment)

        def get(client: AdminClient, args: argparse.Namespace, resource=resource) -> object:
            return client.get(resource(args), **({"applied": True} if args.applied else {}))

        def set_(client: AdminClient, args: argparse.Namespace, resource=resource, policy=policy) -> object:
            return _changed(client, resource(args), f"{policy.suffix} of {level} {args.target}",
                            lambda path: client.post(path, policy.value(args)))

        def remove(client: AdminClient, args: argparse.Namespace, resource=resource, policy=policy) -> object:
            return _changed(client, resource(args), f"{policy.suffix} of {level} {args.target}", client.delete)

        name = policy.suffix.replace("-", " ")
        getter = _command(commands, f"get-{policy.suffix}", get, metavar, f"show the {level}'s {name} policy",
                          _examples(*examples, f"get-{policy.suffix} {{target}}",
                                    f"get-{policy.suffix} {{target}} --applied"))
        getter.add_argument("--applied", "-ap", action="store_true",
                            help="the value in force (topic -> namespace -> broker), not only this level's")
        setter = _command(commands, f"set-{policy.suffix}", set_, metavar, f"set the {level}'s {name} policy",
                          _examples(*examples, f"set-{policy.suffix} {{target}} {policy.example_value}"))
        policy.value_arguments(setter)
        _command(commands, f"remove-{policy.suffix}", remove, metavar,
                 f"remove the {level}'s {name} policy (fall back to the next level)",
                 _examples(*examples, f"remove-{policy.suffix} {{target}}"))
    return commands


def _changed(client: AdminClient, path: str, what: str, change: Callable[[str], object]) -> object:
    """Make a change and print what it changed, as this level's value before and after (null: not set here)."""
    before = client.get(path)
    change(path)
    after = client.get(path)
    print(f"{what}: {json.dumps(before)} -> {json.dumps(after)}")
    return QUIET


def _add_topic_commands(commands: argparse._SubParsersAction) -> None:
    _command(commands, "stats", lambda c, a: c.get(topic_resource(a.target, "stats")), "TOPIC",
             "deduplication status and producers with their last sequence ids",
             _examples("topics", EXAMPLE_TOPIC, "stats {target}"))
    _command(commands, "stats-internal", lambda c, a: c.get(topic_resource(a.target, "internalStats")), "TOPIC",
             "ledgers, last confirmed entry and cursors (the pulsar.dedup cursor's properties are the snapshot)",
             _examples("topics", EXAMPLE_TOPIC, "stats-internal {target}"))
    last = _command(commands, "last-sequence-id",
                    lambda c, a: c.get(topic_resource(a.target, "sequences"), producer=a.producer), "TOPIC",
                    "the highest kop.sequence.id stored for a producer name, per partition (null: not known)",
                    _examples("topics", EXAMPLE_TOPIC, "last-sequence-id {target} --producer loader/orders.jsonl"))
    last.add_argument("--producer", required=True, metavar="NAME", help="the kop.producer.name")
    _command(commands, "list", lambda c, a: c.get(namespace_topics(a.target)), "tenant/namespace",
             "the partitions of every topic in the namespace", _examples("topics", EXAMPLE_NAMESPACE, "list {target}"))
    _command(commands, "list-partitioned-topics", lambda c, a: c.get(namespace_topics(a.target) + "/partitioned"),
             "tenant/namespace", "the topics in the namespace",
             _examples("topics", EXAMPLE_NAMESPACE, "list-partitioned-topics {target}"))


def _add_user_commands(group: argparse.ArgumentParser) -> None:
    commands = group.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    listing = _user_command(commands, "list", "users and their SCRAM mechanisms and iterations", "users list")
    listing.set_defaults(admin_action=lambda c, a: c.get(USERS))
    set_ = _user_command(commands, "set", "create a user or change its password (asked for, never an argument)",
                         "users set alice", "users set alice --password-stdin --iterations 16384")
    set_.add_argument("user")
    set_.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    set_.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                      help=f"SCRAM iterations (default {DEFAULT_ITERATIONS})")
    set_.set_defaults(admin_action=lambda c, a: c.post(f"{USERS}/{quote(a.user, safe='')}",
                                                       {"password": _password(a), "iterations": a.iterations}))
    delete = _user_command(commands, "delete", "remove a user's credentials", "users delete alice")
    delete.add_argument("user")
    delete.set_defaults(admin_action=lambda c, a: c.delete(f"{USERS}/{quote(a.user, safe='')}"))


def _user_command(commands: argparse._SubParsersAction, name: str, help_: str, *examples: str):
    lines = "".join(f"\n  kop admin {example}" for example in examples)
    epilog = f"example{'s' if len(examples) > 1 else ''}:{lines}"
    return commands.add_parser(name, help=help_, description=help_, epilog=epilog,
                               formatter_class=argparse.RawDescriptionHelpFormatter)


def _authorization(args: argparse.Namespace) -> str | None:
    if args.user:
        password = os.environ.get("KOP_ADMIN_PASSWORD") or getpass.getpass(f"password of {args.user}: ")
        return basic_credentials(args.user, password)
    token = os.environ.get("KOP_ADMIN_TOKEN")
    return f"Bearer {token}" if token else None


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"password for {args.user}: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the passwords differ")
    return first


def _command(commands: argparse._SubParsersAction, name: str, action: Action, metavar: str,
             help_: str, examples: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help_, description=help_, epilog=examples,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", metavar=metavar)
    parser.set_defaults(admin_action=action)
    return parser
