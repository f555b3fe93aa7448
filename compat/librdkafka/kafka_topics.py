"""`kafka-topics.sh` for librdkafka's tests (`compat/librdkafka/kafka_path/bin/kafka-topics.sh` runs this).

librdkafka's `test_kafka_topics()` runs `$KAFKA_PATH/bin/kafka-topics.sh --bootstrap-server $BROKERS ...` to
create a topic with configs (0052, 0077), add partitions (0045) or delete a topic (0045). Against a Kafka 3.x
broker the real script only sends Admin API requests, so this does the same with kafka-python's admin client:
CreateTopics, CreatePartitions, DeleteTopics, Metadata and DescribeConfigs. Options, messages and exit codes
follow Kafka's TopicCommand for the subset here (1 on any error); options it does not know are refused.
"""
from __future__ import annotations

import argparse
import re
import sys

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

REQUEST_TIMEOUT_MS = 30_000


class CommandError(Exception):
    """Fails the command with exit status 1, as TopicCommand does."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kafka-topics.sh", description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-server", required=True)
    actions = parser.add_mutually_exclusive_group(required=True)
    for action in ("create", "alter", "delete", "describe", "list"):
        actions.add_argument(f"--{action}", action="store_true")
    parser.add_argument("--topic", help="a name; for all but --create a regular expression, as in Kafka")
    parser.add_argument("--partitions", type=int)
    parser.add_argument("--replication-factor", type=int)
    parser.add_argument("--config", action="append", default=[], help="name=value, topic config (--create)")
    parser.add_argument("--if-not-exists", action="store_true")
    parser.add_argument("--if-exists", action="store_true")
    return parser.parse_args(argv)


def _configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CommandError(f"Invalid topic config: all configs must be in the format \"key=val\": {pair!r}")
        configs[name] = value
    return configs


def _matching(admin: KafkaAdminClient, args: argparse.Namespace) -> list[str]:
    """Topics the --topic expression names (all topics without it); an empty match fails unless --if-exists."""
    topics = sorted(admin.list_topics())
    if args.topic is None:
        return topics
    pattern = re.compile(args.topic.replace(",", "|"))  # Kafka's include list: a regex, commas mean "or"
    chosen = [topic for topic in topics if pattern.fullmatch(topic)]
    if not chosen and not args.if_exists:
        raise CommandError(f"Topic '{args.topic}' does not exist as expected")
    return chosen


def create(admin: KafkaAdminClient, args: argparse.Namespace) -> None:
    if args.topic is None:
        raise CommandError("--topic is required with --create")
    topic = NewTopic(args.topic, num_partitions=-1 if args.partitions is None else args.partitions,
                     replication_factor=-1 if args.replication_factor is None else args.replication_factor,
                     topic_configs=_configs(args.config))
    try:
        admin.create_topics([topic], timeout_ms=REQUEST_TIMEOUT_MS)
    except TopicAlreadyExistsError:
        if args.if_not_exists:
            return
        raise
    print(f"Created topic {args.topic}.")


def alter(admin: KafkaAdminClient, args: argparse.Namespace) -> None:
    if args.config:
        raise CommandError("--config with --alter is not supported by kafka-topics.sh; use kafka-configs.sh")
    if args.partitions is None:
        raise CommandError("--alter needs --partitions")
    topics = _matching(admin, args)
    if topics:
        admin.create_partitions({topic: NewPartitions(args.partitions) for topic in topics},
                                timeout_ms=REQUEST_TIMEOUT_MS)


def delete(admin: KafkaAdminClient, args: argparse.Namespace) -> None:
    topics = _matching(admin, args)
    if topics:
        admin.delete_topics(topics, timeout_ms=REQUEST_TIMEOUT_MS)


def describe(admin: KafkaAdminClient, args: argparse.Namespace) -> None:
    """Kafka's layout: a topic line with the configs that differ from the defaults, then one line per partition."""
    topics = _matching(admin, args)
    if not topics:
        return
    # describe_configs answers the non-default configs by default: the ones Kafka's topic line shows.
    overrides = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics])
    for meta in admin.describe_topics(topics):
        partitions = sorted(meta["partitions"], key=lambda p: p["partition_index"])
        configs = ",".join(f"{name}={entry['value']}"
                           for name, entry in sorted(overrides.get("topic", {}).get(meta["name"], {}).items()))
        print(f"Topic: {meta['name']}\tTopicId: {meta['topic_id']}\tPartitionCount: {len(partitions)}"
              f"\tReplicationFactor: {len(partitions[0]['replica_nodes']) if partitions else 0}\tConfigs: {configs}")
        for p in partitions:
            print(f"\tTopic: {meta['name']}\tPartition: {p['partition_index']}\tLeader: {p['leader_id']}"
                  f"\tReplicas: {_ids(p['replica_nodes'])}\tIsr: {_ids(p['isr_nodes'])}")


def _ids(nodes: list[int]) -> str:
    return ",".join(map(str, nodes))


def list_topics(admin: KafkaAdminClient, args: argparse.Namespace) -> None:
    for topic in _matching(admin, args):
        print(topic)


COMMANDS = {"create": create, "alter": alter, "delete": delete, "describe": describe, "list": list_topics}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = next(COMMANDS[name] for name in COMMANDS if getattr(args, name))
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap_server, client_id="kafka-topics.sh",
                             request_timeout_ms=REQUEST_TIMEOUT_MS)
    try:
        command(admin, args)
    except (CommandError, KafkaError) as exc:
        print(f"Error while executing topic command : {exc}", file=sys.stderr)
        return 1
    finally:
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
