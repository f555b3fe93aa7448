"""The jars under $KAFKA_PATH/libs that the suite's Java helpers are built and run with.

0098_consumer_txn compiles librdkafka's `tests/java/` against `$KAFKA_PATH/libs/kafka-clients-*.jar` and runs its
TransactionProducerCli through `$KAFKA_PATH/bin/kafka-run-class.sh`. The Kafka client jar and the jars it loads come
from the integration tests' Java harness (a PyPI wheel); they are linked into `kafka_path/libs/` (gitignored) under
the names a Kafka distribution gives them.
"""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from compat.librdkafka.runner import KAFKA_PATH
from integration import java_harness

LIBS_DIR = KAFKA_PATH / "libs"
CLIENTS_JAR = "kafka-clients.jar"


def ensure_kafka_libs() -> str | None:
    """Link the Java client's jars into KAFKA_PATH/libs. None when done, else why the Java helpers cannot run."""
    try:
        java_harness.build()
    except java_harness.HarnessBuildError as error:
        return str(error)
    version = kafka_clients_version(java_harness.LIB_DIR / CLIENTS_JAR)
    shutil.rmtree(LIBS_DIR, ignore_errors=True)
    LIBS_DIR.mkdir()
    for jar in java_harness.WHEEL_JARS:
        name = f"kafka-clients-{version}.jar" if jar == CLIENTS_JAR else jar
        (LIBS_DIR / name).symlink_to(java_harness.LIB_DIR / jar)
    return None


def kafka_clients_version(jar: Path) -> str:
    """The version kafka-clients records in its own jar (kafka/kafka-version.properties)."""
    with zipfile.ZipFile(jar) as archive:
        properties = archive.read("kafka/kafka-version.properties").decode()
    for line in properties.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "version":
            return value.strip()
    raise ValueError(f"{jar}: kafka/kafka-version.properties names no version")
