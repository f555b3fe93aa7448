"""The options of kop's Spark data source, named as Spark's Kafka source and sink name them, so a job moves between
`format("kafka")` and `format("kop")` by changing the format alone."""
import json
from collections.abc import Mapping
from dataclasses import dataclass

EARLIEST = -2  # Spark's Kafka source spells "earliest" -2 and "latest" -1 in its offset JSON
LATEST = -1
KAFKA_PREFIX = "kafka."


class OptionError(ValueError):
    """An option is missing or malformed; the message names it."""


@dataclass(frozen=True)
class OffsetSpec:
    """startingOffsets/endingOffsets: one default (EARLIEST or LATEST) and explicit offsets per topic-partition."""
    default: int
    explicit: Mapping[tuple[str, int], int]

    def offset_for(self, topic: str, partition: int) -> int:
        return self.explicit.get((topic, partition), self.default)


def kafka_config(options: Mapping[str, str]) -> dict[str, str]:
    """Every `kafka.X` option as the client property `X` (librdkafka spells the common ones as the Java client)."""
    config = {key[len(KAFKA_PREFIX):]: value for key, value in options.items()
              if key.lower().startswith(KAFKA_PREFIX)}
    if "bootstrap.servers" not in config:
        raise OptionError("option kafka.bootstrap.servers is required")
    return config


def reader_config(options: Mapping[str, str]) -> dict[str, str]:
    """kafka_config for a read: committed records only unless `kafka.isolation.level` says otherwise, so the planner's
    `latest` (the last stable offset) and the tasks' reads agree, whatever the Kafka client's own default."""
    return {"isolation.level": "read_committed", **kafka_config(options)}


def subscribed_topics(options: Mapping[str, str]) -> list[str]:
    topics = [t.strip() for t in options.get("subscribe", "").split(",") if t.strip()]
    if not topics:
        raise OptionError("option subscribe (a comma-separated list of topics) is required")
    return topics


def offset_spec(options: Mapping[str, str], name: str, default: str) -> OffsetSpec:
    """`earliest`, `latest` or Spark's JSON `{"topic": {"0": 23, "1": -2}}` (-2 earliest, -1 latest)."""
    text = options.get(name, default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(EARLIEST if text.lower() == "earliest" else LATEST, {})
    try:
        parsed = json.loads(text)
        explicit = {(topic, int(partition)): int(offset)
                    for topic, offsets in parsed.items() for partition, offset in offsets.items()}
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"option {name} must be earliest, latest or JSON like "
                          f'{{"topic": {{"0": 23}}}}, got {text!r}') from None
    if any(offset < EARLIEST for offset in explicit.values()):
        raise OptionError(f"option {name}: offsets are >= 0, or -2 (earliest), -1 (latest): {text!r}")
    return OffsetSpec(LATEST if default == "latest" else EARLIEST, explicit)


def flag(options: Mapping[str, str], name: str, default: bool = False) -> bool:
    text = options.get(name, str(default)).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, got {text!r}")
    return text == "true"
