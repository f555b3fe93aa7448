import os

import pytest

from integration.broker_process import KOP_SCRIPT, BrokerProcess


@pytest.fixture
def kop_script():
    """The `kop` console script, as a user runs it."""
    if not os.access(KOP_SCRIPT, os.X_OK):
        pytest.fail(f"no `kop` console script at {KOP_SCRIPT}: is the project installed into this environment?")
    return KOP_SCRIPT


@pytest.fixture
def broker(tmp_path):
    """A fresh `kop standalone` process on a free port with its own data directory."""
    proc = BrokerProcess(str(tmp_path / "data")).start()
    yield proc
    proc.stop()


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers with custom config; all are stopped at the end."""
    started = []

    def make(config: dict[str, str] | None = None, name: str = "data") -> BrokerProcess:
        proc = BrokerProcess(str(tmp_path / name), config=dict(config or {})).start()
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop()


@pytest.fixture
def start_broker(tmp_path):
    """start(config) -> a broker with the admin API on a free port; all are stopped at the end."""
    started = []

    def start(config: dict[str, str] | None = None) -> BrokerProcess:
        broker = BrokerProcess(str(tmp_path / f"data{len(started)}"), admin_port=0, config=dict(config or {}))
        started.append(broker.start())
        return broker

    yield start
    for broker in started:
        broker.stop()
