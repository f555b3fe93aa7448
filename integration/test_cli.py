"""The `kop` console script as a user runs it, and how `kop standalone` treats a config file."""
import argparse
import os
import subprocess
from importlib import metadata

import pytest

from integration.broker_process import BrokerProcess
from integration.clients import kp_consume_all, kp_produce


def test_kop_help_lists_the_commands(kop_script, tmp_path):
    done = subprocess.run([kop_script, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "standalone" in done.stdout and "admin" in done.stdout
    done = subprocess.run([kop_script, "standalone", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--listen" in done.stdout and "--data-dir" in done.stdout


def test_kop_alone_prints_the_help_and_version_prints_the_installed_version(kop_script, tmp_path):
    done = subprocess.run([kop_script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: kop ") and "examples:" in done.stdout
    done = subprocess.run([kop_script, "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"kop {metadata.version('kop')}\n")


def _commands(parser: argparse.ArgumentParser):
    """Every parser under `parser`, itself included."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _commands(sub)


def test_every_command_has_help_with_examples():
    from kop.cli import build_parser
    commands = list(_commands(build_parser()))
    assert len(commands) > 15  # kop, standalone, admin, its groups and each of their commands
    without = [c.prog for c in commands if "example" not in c.format_help()]
    assert without == []
    for command in commands:  # each example is a command this parser takes
        lines = [line.split("#")[0].split() for line in command.format_help().splitlines()]
        for words in (w for w in lines if w[:1] == ["kop"] and "--version" not in w):
            build_parser().parse_args(words[1:])


@pytest.mark.file_storage
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
