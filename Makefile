# Two entry points for a fresh machine (Python 3.11 + pip): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LISTEN ?= 127.0.0.1:9092
DATA ?= ./data

.PHONY: run test test-slow test-fast test-postgres test-postgres-slow postgres fuzz fuzz-atheris faketime soak bench bench-quick proto compat compat-quick java kcat clean pipeline-demo

$(VENV)/.installed: pyproject.toml setup.py protocol/_accel.c
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/kop standalone --listen $(LISTEN) --data-dir $(DATA)

# The Java client tests need a JDK: install Debian's when we can (root + apt); without one they skip with the reason.
java: $(VENV)/.test-installed
	@command -v javac >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless) \
	  >/dev/null 2>&1; } || echo "no JDK installed: the Java client tests will be skipped"
	@$(PY) -m integration.java_harness build || echo "java harness not built: the Java client tests will be skipped"

# kcat (Debian's) is one of the clients the tests drive; install it when we can (root + apt), else its test skips.
kcat:
	@command -v kcat >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat) >/dev/null 2>&1; } || \
	  echo "kcat not installed: its test will be skipped"

# libfaketime (Debian's faketime) moves a broker's wall clock in the clock-jump tests; without it they skip.
faketime:
	@[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || { command -v apt-get >/dev/null && \
	  [ "$$(id -u)" = 0 ] && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime) \
	  >/dev/null 2>&1; } || echo "libfaketime not installed: the clock-jump tests will be skipped"

# Debian's PostgreSQL server binaries: the PostgreSQL engine's tests start a server of their own from them (as the
# `postgres` user when run as root); without them those tests skip with the reason.
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null 2>&1; } || \
	  echo "PostgreSQL not installed: the PostgreSQL engine's tests will be skipped"

# Tests run on several pytest-xdist workers (TEST_WORKERS=0 runs them in pytest's own process): most of a test's time is
# brokers and clients waiting on each other, so two cores keep four workers busy. Each worker takes its ports from a
# slice of its own and starts its own PostgreSQL server where tests need one.
TEST_WORKERS ?= 4
SLOW_WORKERS ?= 3
XDIST = -p xdist -n $(1) --dist worksteal

test: $(VENV)/.test-installed java kcat faketime postgres
	$(PY) -m pytest -q -m "not slow" $(call XDIST,$(TEST_WORKERS)) --durations=30

# The integration suite again with every broker on the PostgreSQL engine (a database each, one server per session),
# plus the engine's own crash tests. Its own target: both runs together would not fit make test's budget.
test-postgres: $(VENV)/.test-installed java kcat faketime postgres
	$(PY) -m pytest -q -m "not slow" $(call XDIST,$(TEST_WORKERS)) --durations=20 --storage postgresql integration

# The slow scenarios again on the PostgreSQL engine (about 25 minutes; CI leaves them out for its time budget).
test-postgres-slow: $(VENV)/.test-installed java kcat faketime postgres
	$(PY) -m pytest -q -m slow $(call XDIST,$(SLOW_WORKERS)) --durations=20 --storage postgresql integration

# The scenarios of minutes (Spark in local mode), kept out of `make test` so it stays quick; CI runs both.
test-slow: $(VENV)/.test-installed java
	$(PY) -m pytest -q -m slow $(call XDIST,$(SLOW_WORKERS)) --durations=20

test-fast: $(VENV)/.test-installed
	$(PY) -m pytest -q tests

# The fuzzing properties of tests/test_fuzz.py and tests/test_record_walk.py (request decoder, the C record walk,
# record-batch validator, codecs, SASL messages, admin credentials) at length: make test runs them with a few hundred
# examples each, this with FUZZ_EXAMPLES.
FUZZ_EXAMPLES ?= 20000
fuzz: $(VENV)/.test-installed
	KOP_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py tests/test_record_walk.py

# The same oracles under atheris, coverage-guided (python -m fuzz): each target (or FUZZ_TARGETS) for FUZZ_SECONDS,
# growing its corpus in build/fuzz/TARGET; an input that breaks an oracle or hangs is saved there and fails the run.
FUZZ_SECONDS ?= 300
fuzz-atheris: $(VENV)/.test-installed
	$(PIP) install -q -e '.[fuzz]'
	$(PY) -m fuzz --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The nemesis soak: idempotent producers, a consumer group of every client and a transactional producer through a
# seeded schedule of random faults (cuts, kill -9, SIGSTOP, a full disk when a tmpfs can be mounted, policy flips).
# SOAK_SECONDS=600 by default; a failure prints the seed, and SOAK_ARGS="--seed N" replays it. SOAK_ARGS="--topology
# geo [--two-way]" runs it against two clusters that replicate, "--topology cluster" against three brokers on a
# PostgreSQL it starts.
SOAK_SECONDS ?= 600
soak: $(VENV)/.test-installed
	SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m integration.soak $(SOAK_ARGS)

# The PySpark pipeline on generated data with injected failures, and its controls; reports in build/pipeline-demo.
pipeline-demo: $(VENV)/.test-installed java
	$(PY) -m kop.cli pipeline demo --work-dir build/pipeline-demo

bench: $(VENV)/.test-installed
	$(PY) -m bench.run

# The produce path beside an older commit's (main by default), as new/old ratios measured in the same run (~5 min).
BENCH_AGAINST ?= main
bench-quick: $(VENV)/.test-installed
	$(PY) -m bench.quick --against $(BENCH_AGAINST)

proto: $(VENV)/.installed
	$(PIP) install -q grpcio-tools==1.85.1
	cd proto && ../$(PY) -m grpc_tools.protoc -I. --python_out=. kop.proto

# java: librdkafka's 0098_consumer_txn runs a Java transactional producer (kafka_path/bin/kafka-run-class.sh).
compat: $(VENV)/.test-installed java
	$(PY) -m compat.run

compat-quick: $(VENV)/.test-installed
	$(PY) -m compat.run --quick

clean:
	rm -rf $(VENV) build *.egg-info
