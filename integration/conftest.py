import gc
import os
import shutil

import pytest

from integration.broker_process import KOP_SCRIPT, BrokerProcess
from integration.clients import ck_let_go


@pytest.fixture
def kop_script():
    """The `kop` console script, as a user runs it."""
    if not os.access(KOP_SCRIPT, os.X_OK):
        pytest.fail(f"no `kop` console script at {KOP_SCRIPT}: is the project installed into this environment?")
    return KOP_SCRIPT


@pytest.fixture
def ck_producers():
    """make(config) -> a confluent-kafka Producer, let go when the test ends (`ck_let_go`), so librdkafka's threads do
    not linger for the rest of the worker's tests."""
    from confluent_kafka import Producer
    made = []

    def make(config: dict) -> Producer:
        made.append(Producer(config))
        return made[-1]

    yield make
    closed = [ck_let_go(producer) for producer in made]
    made.clear()
    if not all(closed):  # the test's frames may still hold it, in a cycle through a caught exception's traceback
        gc.collect()


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

    def make(config: dict[str, str] | None = None, name: str = "data", **options) -> BrokerProcess:
        """options: BrokerProcess's own (admin_port, env, ...)."""
        proc = BrokerProcess(str(tmp_path / name), config=dict(config or {}), **options).start()
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


# Spark tests: one broker and one Spark session per test module (a JVM costs seconds to start). local[2,4]: two task
# slots, and a task may fail three times before its job does (Spark's maxFailures).
SPARK_MASTER = "local[2,4]"


@pytest.fixture(scope="module")
def spark_broker(tmp_path_factory):
    """A kop broker with its admin API for a whole module (its tests use topics of their own)."""
    proc = BrokerProcess(str(tmp_path_factory.mktemp("kop") / "data"), admin_port=0).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no JDK: Spark needs Java 17 (`make java` installs Debian's)")
    from kop.spark.session import SparkSettings, spark_session  # here: only Spark tests load pyspark
    session = spark_session(SparkSettings(master=SPARK_MASTER, app_name="kop-tests"))
    yield session
    session.stop()
