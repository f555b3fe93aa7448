"""The `kop` console script as a user runs it, and how `kop standalone` treats a config file."""
import os
import subprocess
import sys

import pytest

from integration.broker_process import BrokerProcess
from integration.clients import kp_consume_all, kp_produce

KOP = os.path.join(os.path.dirname(sys.executable), "kop")  # installed next to the interpreter, as pip puts it


@pytest.fixture
def kop_script():
    if not os.access(KOP, os.X_OK):
        pytest.fail(f"no `kop` console script at {KOP}: is the project installed into this environment?")
    return KOP


def test_kop_help_lists_the_commands(kop_script, tmp_path):
    done = subprocess.run([kop_script, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "standalone" in done.stdout and "admin" in done.stdout
    done = subprocess.run([kop_script, "standalone", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--listen" in done.stdout and "--data-dir" in done.stdout


def test_kop_standalone_from_the_console_script_serves_clients(kop_script, tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"), program=(kop_script,)).start()
    try:
        [meta] = kp_produce(broker.bootstrap, "via-script", [(b"k", b"hello", [], 1_700_000_000_000)])
        assert (meta.partition, meta.offset) == (0, 0)
        [got] = kp_consume_all(broker.bootstrap, "via-script", 1)
        assert (got.key, got.value) == (b"k", b"hello")
    finally:
        assert broker.stop() == 0  # SIGTERM: a clean shutdown
    assert os.path.isdir(tmp_path / "data" / "ledgers")


def test_unknown_config_keys_are_logged_and_ignored(broker_factory):
    """Configs copied from Kafka or Pulsar carry keys kop does not implement: each gets a warning naming it, the
    broker still starts, and the keys it does know take effect."""
    b = broker_factory({"num.partitions": "3", "group.max.size": "10", "log.flush.interval.messages": "1",
                        "managedLedgerMaxEntriesPerLedger": "50000"})
    with open(b.log_path) as f:
        warnings = [line for line in f if "unknown key" in line]
    named = sorted(key for key in ("num.partitions", "group.max.size", "log.flush.interval.messages",
                                   "managedLedgerMaxEntriesPerLedger") if any(key + " " in w for w in warnings))
    assert named == ["log.flush.interval.messages", "managedLedgerMaxEntriesPerLedger"]
    assert len(warnings) == 2
    kp_produce(b.bootstrap, "three", [(None, b"x", [], 1_700_000_000_000)])
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=b.bootstrap)
    try:
        assert consumer.partitions_for_topic("three") == {0, 1, 2}
    finally:
        consumer.close()
