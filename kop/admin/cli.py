"""`kop admin`: pulsar-admin's deduplication commands over kop's admin REST API.

examples:
  kop admin namespaces set-deduplication public/default --enable
  kop admin --admin-url http://127.0.0.1:8081 topics get-deduplication my-topic --applied
  kop admin topics stats-internal my-topic
  kop admin clusters create west --broker-url west.example.com:9092 --admin-url http://west.example.com:8080
  kop admin namespaces set-clusters public/default --clusters east,west

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

from kop.admin.client import (CLUSTERS_PATH, DEFAULT_ADMIN_URL, AdminClient, AdminError, basic_credentials,
                              cluster_resource, group_resource, namespace_resource, namespace_topics, topic_resource)
from kop.admin.user_routes import USERS
from kop.replication.clusters import SASL_MECHANISMS, SECURITY_PROTOCOLS
from kop.security.users import DEFAULT_ITERATIONS


def _enable_arguments(parser: argparse.ArgumentParser) -> None:
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--enable", "-e", dest="enable", action="store_true", default=None, help="turn it on")
    choice.add_argument("--disable", "-d", dest="enable", action="store_false", help="turn it off")


def _interval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", "-i", type=int, required=True, help="seconds (0 = no time-based snapshots)")


def _ttl_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ttl", "-t", type=int, required=True,
                        help="seconds: a replicator does not send records older than this (0 = never expire)")


def _clusters_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clusters", "-c", required=True, type=lambda v: [c for c in v.split(",") if c],
                        help="comma-separated cluster names, this one included (e.g. east,west)")


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
    PolicyCommands("clusters", "replication", "replication", _clusters_arguments, lambda a: a.clusters,
                   "--clusters east,west"),
    PolicyCommands("replicated-subscriptions", "replicatedSubscriptions", "replicatedSubscriptions",
                   _enable_arguments, lambda a: a.enable, "--enable"),
    PolicyCommands("message-ttl", "messageTTL", "messageTTL", _ttl_arguments, lambda a: a.ttl, "--ttl 3600"),
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
    groups = admin.add_subparsers(dest="admin_group", required=True, metavar="{namespaces,topics,clusters,groups,users}")
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
    _add_cluster_commands(groups.add_parser(
        "clusters", help="the clusters this broker replicates to", description="The clusters registry.",
        epilog=_examples("clusters", "west", "create {target} --broker-url west.example.com:9092", "list"),
        formatter_class=argparse.RawDescriptionHelpFormatter))
    _add_group_commands(groups.add_parser(
        "groups", help="consumer groups' geo-replication", description="Consumer groups' geo-replication (PIP-33).",
        epilog=_examples("groups", "orders-app", "set-replicated {target} --enable", "get-replicated {target}"),
        formatter_class=argparse.RawDescriptionHelpFormatter))
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


def _add_group_commands(group: argparse.ArgumentParser) -> None:
    commands = group.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    setter = _command(commands, "set-replicated", lambda c, a: c.post(group_resource(a.target, "replicated"), a.enable),
                      "GROUP", "replicate the group's committed offsets to the other clusters, or stop",
                      _examples("groups", "orders-app", "set-replicated {target} --enable"))
    _enable_arguments(setter)
    _command(commands, "get-replicated", lambda c, a: c.get(group_resource(a.target, "replicated")), "GROUP",
             "whether the group's committed offsets are replicated", _examples("groups", "orders-app",
                                                                                 "get-replicated {target}"))


def _add_cluster_commands(group: argparse.ArgumentParser) -> None:
    commands = group.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    def body(args: argparse.Namespace) -> dict:
        security = {"securityProtocol": args.security_protocol, "saslMechanism": args.sasl_mechanism,
                    "saslUsername": args.sasl_username, "sslCaFile": args.ssl_ca_file}
        if args.sasl_username:
            security["saslPassword"] = _link_password(args)
        return {"brokerServiceUrl": args.broker_url, "serviceUrl": args.cluster_admin_url,
                **{key: value for key, value in security.items() if value}}

    def put(client: AdminClient, args: argparse.Namespace) -> object:
        return client.put(cluster_resource(args.target), body(args))

    def post(client: AdminClient, args: argparse.Namespace) -> object:
        return client.post(cluster_resource(args.target), body(args))

    for name, action, verb in (("create", put, "register"), ("update", post, "change the definition of")):
        examples = _examples(
            "clusters", "west",
            f"{name} {{target}} --broker-url west.example.com:9092 --admin-url http://west.example.com:8080",
            f"{name} {{target}} --broker-url west.example.com:9093 --security-protocol SASL_SSL --sasl-mechanism "
            "SCRAM-SHA-512 --sasl-username replicator --ssl-ca-file /etc/kop/ca.pem")
        parser = _command(commands, name, lambda c, a, action=action: action(c, a) or QUIET, "NAME",
                          f"{verb} a cluster", examples)
        parser.add_argument("--broker-url", required=True, metavar="HOST:PORT", help="the cluster's Kafka listener")
        # its own dest: `kop admin --admin-url` names the broker this command talks to
        parser.add_argument("--admin-url", dest="cluster_admin_url", default="", metavar="URL",
                            help="the cluster's admin API")
        link = parser.add_argument_group("how the replicators connect (as a Kafka client's settings say it)")
        link.add_argument("--security-protocol", choices=SECURITY_PROTOCOLS, default="",
                          help="of the listener at --broker-url (default PLAINTEXT)")
        link.add_argument("--sasl-mechanism", choices=SASL_MECHANISMS, default="")
        link.add_argument("--sasl-username", default="", metavar="USER",
                          help="the password is asked for, or read from standard input with --sasl-password-stdin")
        link.add_argument("--sasl-password-stdin", action="store_true")
        link.add_argument("--ssl-ca-file", default="", metavar="PATH",
                          help="the CA certificate (PEM) to trust, a file on the broker's machine (default: the "
                               "system's)")
    _command(commands, "get", lambda c, a: c.get(cluster_resource(a.target)), "NAME", "show a cluster",
             _examples("clusters", "west", "get {target}"))
    _command(commands, "delete", lambda c, a: c.delete(cluster_resource(a.target)) or QUIET, "NAME",
             "remove a cluster (its replicators stop)", _examples("clusters", "west", "delete {target}"))
    lister = commands.add_parser("list", help="the registered clusters", description="The registered clusters.",
                                 epilog=_examples("clusters", "", "list"),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    lister.set_defaults(admin_action=lambda c, a: c.get(CLUSTERS_PATH))
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


def _link_password(args: argparse.Namespace) -> str:
    if args.sasl_password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return getpass.getpass(f"password of {args.sasl_username} at {args.target}: ")


def _command(commands: argparse._SubParsersAction, name: str, action: Action, metavar: str,
             help_: str, examples: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help_, description=help_, epilog=examples,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", metavar=metavar)
    parser.set_defaults(admin_action=action)
    return parser
