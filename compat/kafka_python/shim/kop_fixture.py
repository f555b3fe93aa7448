"""kafka-python's KafkaFixture started as kop instead of Kafka, for the tests that start a broker of their own with a
security protocol (`test_sasl_integration.py`: SASL_PLAINTEXT with PLAIN or SCRAM; `test_ssl_integration.py`: SSL).

The fixture's own start renders Kafka's kafka.properties template, makes JKS keystores with keytool and adds SCRAM
users with kafka-storage.sh, none of which applies to kop (and the sdist has no templates). `install` replaces the
three methods that do so: `open`/`start` start kop with a PLAINTEXT listener and one of the fixture's protocol on the
fixture's port, the fixture's user (`alice`) in kop's user store, PEM certificates whose CA is the `ca-cert` the tests
trust; `get_topic_names` lists topics through the Admin API. The fixture's `stop`, `close` and client parameters are
kafka-python's own.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import py

from compat.broker import KopBroker
from integration.certificates import make_certificates
from kop.security.users import UserStore


class KopService:
    """What the fixture calls its `child`: the kop process."""

    def __init__(self, broker: KopBroker) -> None:
        self.broker = broker

    def stop(self) -> None:
        self.broker.stop()

    def dump_logs(self) -> None:
        print(self.broker.log_path.read_text(errors="replace")[-4000:])


def install(fixture_class: type) -> None:
    fixture_class.open = _start
    fixture_class.start = _start
    fixture_class.get_topic_names = _topic_names


def _start(self) -> None:
    if self.running:
        return
    if self.tmp_dir is None:
        self.tmp_dir = py.path.local.mkdtemp()
    root = Path(self.tmp_dir.strpath)
    self.host = "127.0.0.1"  # kop listens on IPv4; "localhost" may name ::1 first
    properties = {"listeners": f"PLAINTEXT://127.0.0.1:0,{self.transport}://127.0.0.1:{self.port}",
                  "broker.id": str(self.broker_id), "num.partitions": str(self.partitions)}
    if self.sasl_enabled:
        properties["sasl.enabled.mechanisms"] = self.sasl_mechanism
        (root / "data").mkdir(parents=True, exist_ok=True)
        asyncio.run(UserStore(str(root / "data")).set_password(self.broker_user, self.broker_password))
    if self.ssl_enabled:
        self.ssl_dir = str(root / "ssl")
        certificates = make_certificates(self.ssl_dir)
        shutil.copyfile(certificates.ca, Path(self.ssl_dir) / "ca-cert")
        properties["ssl.keystore.location"] = certificates.broker
    broker = KopBroker(log_path=root / "kop.log", properties=properties, data_dir=root / "data")
    broker.start()
    self.child = KopService(broker)
    self.running = True


def _topic_names(self) -> list[str]:
    from kafka import KafkaAdminClient
    with KafkaAdminClient(**self._enrich_client_params({}, client_id="topic_lister")) as admin:
        return admin.list_topics()
