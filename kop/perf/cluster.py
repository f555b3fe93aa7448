"""Reaching the brokers and making sure the topic is there, before any clock starts.

librdkafka retries an unreachable broker until its timeouts expire; here the error callback's "all brokers down" (or
a name that does not resolve) ends the wait at once, so a wrong --bootstrap-server is one line within a second or
two, not a minute of silence.
"""
from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from kop.perf.options import PerfError

CONNECT_TIMEOUT_S = 15.0
# Connection errors that will not go away by waiting a few more seconds.
HOPELESS = {KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE, KafkaError._AUTHENTICATION, KafkaError._SSL}

# librdkafka's own log lines (a connection refused, retries) go through this logger, not straight to stderr: the
# tool reports what matters in one line of its own.
CLIENT_LOG = logging.getLogger("kop.perf.client")
CLIENT_LOG.setLevel(logging.CRITICAL)


def reason(exc: KafkaException) -> str:
    """The text of a client exception, whose argument is a KafkaError or, for some calls, a plain string."""
    error = exc.args[0] if exc.args else exc
    return error.str() if isinstance(error, KafkaError) else str(error)


def client_config(bootstrap: str, properties: dict[str, str]) -> dict:
    return {"bootstrap.servers": bootstrap, "logger": CLIENT_LOG, **properties}


def prepare_topic(bootstrap: str, topic: str, properties: dict[str, str], partitions: int | None = None,
                  replication_factor: int = -1, missing_hint: str = "") -> int:
    """The topic's partition count; creates it with `partitions` if it does not exist and `partitions` is given.
    `properties` are the client's (security settings apply to the admin connection too)."""
    errors: list[KafkaError] = []
    admin = AdminClient(client_config(bootstrap, {**_common_only(properties), "allow.auto.create.topics": "false",
                                                  "error_cb": errors.append}))
    found = _topic_partitions(admin, bootstrap, topic, errors)
    if found is not None:
        return found
    if partitions is None:
        raise PerfError(f"topic {topic!r} does not exist{missing_hint}")
    future = admin.create_topics([NewTopic(topic, partitions, replication_factor)],
                                 operation_timeout=CONNECT_TIMEOUT_S)[topic]
    try:
        future.result(CONNECT_TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0]
        if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):  # created meanwhile by someone else: fine
            raise PerfError(f"creating topic {topic!r} failed: {reason(exc)}") from None
    return partitions


def _topic_partitions(admin: AdminClient, bootstrap: str, topic: str, errors: list[KafkaError]) -> int | None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            metadata = admin.list_topics(topic, timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            break
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback
            if any(e.code() in HOPELESS for e in errors):
                # The first error says why (connection refused, unknown host); "all brokers down" only sums up.
                raise PerfError(f"cannot reach {bootstrap}: {errors[0].str()}") from None
            if time.monotonic() >= deadline:
                raise PerfError(f"no answer from {bootstrap} within {CONNECT_TIMEOUT_S:.0f} s: "
                                f"{reason(exc)}") from None
    described = metadata.topics.get(topic)
    if described is None or described.error is not None and described.error.code() in (
            KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return None
    if described.error is not None:
        raise PerfError(f"topic {topic!r}: {described.error.str()}")
    return len(described.partitions)


# Properties an admin client accepts from a producer's or consumer's settings: the connection's, not the role's.
COMMON_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "api.version", "metadata.",
                   "reconnect.", "resolve.", "connections.max.idle.ms")


def _common_only(properties: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in properties.items() if k.startswith(COMMON_PREFIXES)}
