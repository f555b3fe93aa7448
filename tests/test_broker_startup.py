"""Broker.bind claims the data directory and the ports before anything is loaded, and serves nothing until start
has loaded the topics (in process; the same through real `kop standalone` processes in
integration/test_startup.py)."""
import errno
import os
import re
import socket

import pytest

from kop.broker import Broker
from kop.config import BrokerConfig
from kop.data_dir import LOCK_FILE
from kop.startup import StartupError


def config(data_dir, **settings) -> BrokerConfig:
    return BrokerConfig(**{"port": 0, "admin_port": -1, "fsync": False, "data_dir": str(data_dir), **settings})


def connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except ConnectionRefusedError:
        return False


def port_is_held(port: int) -> bool:
    """Whether some socket is bound to the port: binding without SO_REUSEADDR fails then, listening or not."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
    return False


async def test_bind_holds_the_ports_and_the_directory_but_serves_only_after_start(tmp_path):
    broker = Broker(config(tmp_path / "data"))
    await broker.bind()
    try:
        assert not (tmp_path / "data" / "topics").exists()  # nothing loaded yet
        for port in (broker.port, broker.admin_port):
            assert port_is_held(port) and not connects(port)
        with pytest.raises(StartupError, match="is in use by another kop"):  # flock conflicts in one process
            await Broker(config(tmp_path / "data")).bind()
        await broker.start()
        assert connects(broker.port) and connects(broker.admin_port)
    finally:
        await broker.stop()
    assert not port_is_held(broker.port)
    # stop released the directory: another broker takes it
    again = Broker(config(tmp_path / "data"))
    await again.start()
    await again.stop()


async def test_a_failed_bind_releases_what_it_took(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        broker = Broker(config(tmp_path / "data", admin_port=busy))
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{busy} for the admin API: "
                                               f"Address already in use"):
            await broker.bind()
        assert not port_is_held(broker.port)
        # the default admin port gives way instead
        gives_way = Broker(config(tmp_path / "data", admin_port=busy), admin_port_may_be_taken=True)
        await gives_way.start()
        assert gives_way.admin_port == 0 and connects(gives_way.port)
        await gives_way.stop()


async def test_the_lock_file_names_the_holder_and_survives_it(tmp_path):
    broker = Broker(config(tmp_path / "data"))
    await broker.bind()
    assert (tmp_path / "data" / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    data = tmp_path / "data"
    with pytest.raises(StartupError, match=re.escape(f"data directory {data} is in use by another kop "
                                                     f"(pid {os.getpid()}, lock file {data}/.lock)")):
        await Broker(config(tmp_path / "data")).bind()
    await broker.start()
    await broker.stop()
    assert (tmp_path / "data" / LOCK_FILE).exists()  # never removed: see kop/data_dir.py
