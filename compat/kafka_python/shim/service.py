"""Stand-in for kafka-python's test/service.py, which its sdist does not ship.

Only the external-broker path is supported: the fixtures wrap the broker named by KAFKA_URI in an
ExternalService. Tests that need a broker process of their own (SSL or SASL listeners, ZooKeeper) meet
SpawnedService, which says plainly that this shim does not start Kafka.
"""
from __future__ import annotations


class ExternalService:
    """A broker somebody else started and stops; nothing to spawn, nothing to dump."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def wait_for(self, pattern: str, timeout: float = 30) -> bool:
        return True

    def dump_logs(self) -> None:
        pass


class SpawnedService:
    """Would start a Kafka or ZooKeeper JVM; this shim runs only against an external broker."""

    def __init__(self, args=None, env=None) -> None:
        self.args = args

    def start(self) -> None:
        raise RuntimeError(
            "kop compat shim: this test needs its own Kafka/ZooKeeper process "
            f"({' '.join(map(str, self.args or []))[:120]}); only KAFKA_URI (external broker) is supported"
        )

    def stop(self) -> None:
        pass

    def wait_for(self, pattern: str, timeout: float = 30) -> bool:
        return False

    def dump_logs(self) -> None:
        pass
