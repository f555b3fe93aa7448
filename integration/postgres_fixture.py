"""pytest fixtures for the PostgreSQL engine: one real server per test session (see postgres_server), a database per
user of it. Registered for the whole repository by the root conftest.py."""
import itertools
import os

import pytest

from integration import broker_process
from integration.broker_process import free_port
from integration.postgres_server import PostgresServer, server_binaries

_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server; skipped with the reason where Debian's binaries are not installed (`make
    postgres` installs them)."""
    bin_dir = server_binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql (`make postgres` installs them)")
    server = PostgresServer(bin_dir, free_port()).init().start()
    yield server
    # Its data is removed next, so it stops as a crash would, with no shutdown checkpoint: with 40 databases a clean
    # stop and the removal took 18-42 s on the 2-core machine, this 3 s (time the session's last test is charged with).
    server.stop("immediate")
    server.remove()


def new_database(server: PostgresServer) -> str:
    """A fresh database's URL: each test (each broker) starts from an empty schema."""
    return server.create_database(f"kop_{os.getpid()}_{next(_names)}")


@pytest.fixture
def postgres_url(postgres_server):
    return new_database(postgres_server)


def pytest_addoption(parser):
    parser.addoption("--storage", choices=("file", "postgresql"), default="file",
                     help="the storage engine of the brokers integration tests start (default file; `make "
                          "test-postgres` runs them on postgresql)")
    parser.addoption("--pg-setting", action="append", default=[], metavar="KEY=VALUE",
                     help="a setting every broker on PostgreSQL gets unless its test sets it (repeatable), e.g. "
                          "managed.ledger.cache.bytes=65536")


@pytest.fixture(scope="session", autouse=True)
def storage_engine(request):
    """The session's storage engine for every broker the tests start: `--storage postgresql` gives each data
    directory a database of its own on the session's PostgreSQL server."""
    engine = request.config.getoption("--storage")
    if engine == "postgresql":
        server = request.getfixturevalue("postgres_server")
        broker_process.new_postgres_database = lambda: new_database(server)
    broker_process.postgres_settings.update(
        setting.split("=", 1) for setting in request.config.getoption("--pg-setting"))
    yield engine
    broker_process.new_postgres_database = None
    broker_process.postgres_settings.clear()


@pytest.fixture(autouse=True)
def file_storage_only(request, storage_engine):
    marker = request.node.get_closest_marker("file_storage")
    if storage_engine != "file" and marker is not None:
        pytest.skip(marker.kwargs.get("reason", "inspects or damages the file engine's files (runs with --storage file)"))
