"""Fetch node-rdkafka from npm, build its bundled librdkafka and test-runner once per package version."""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from compat.paths import build_cache_dir
from compat.system import ensure_debian_packages, exclusive_lock

NPM_PACKAGE = "node-rdkafka"
NPM_VERSION = "3.6.1"  # bundles librdkafka v2.12.0
LIBRDKAFKA_VERSION = "2.12.0"
# What the build needs -> the Debian package that provides it. npm fetches the package through its own
# registry client; configure's mklove scripts want python3.
BUILD_REQUIREMENTS = {
    "gcc": "build-essential",
    "g++": "build-essential",
    "make": "build-essential",
    "/usr/include/zlib.h": "zlib1g-dev",
    "python3": "python3",
    "npm": "npm",
    # The tests that check statistics JSON (0053_stats, 0110_batch_size) are compiled only with RapidJSON.
    "/usr/include/rapidjson/rapidjson.h": "rapidjson-dev",
    # TLS, and with it SASL PLAIN and SCRAM (built in; --disable-sasl only leaves out Cyrus SASL, i.e. GSSAPI)
    "/usr/include/openssl/ssl.h": "libssl-dev",
}
# The one change made to the suite's sources: these tests create topics with replication factor 3, for
# trivup's three-broker cluster, which any one-broker cluster (Kafka's too) refuses. Built with -1, the
# broker's default, they test the same things on one broker.
ONE_BROKER_SOURCES = ("0098-consumer-txn.cpp", "0103-transactions.c", "0142-reauthentication.c")
_REPLICATION_FACTOR_3 = re.compile(r"(create_topic_wait_exists\([^;]*?, )3(, 5000\))")
CONFIGURE = "./configure --disable-curl --disable-sasl --disable-zstd --disable-lz4-ext"


def build_key() -> str:
    """Names the cache entry: the package version plus a digest of what the build is made with, so a new
    configure line or build requirement gets a fresh build instead of reusing one made without it."""
    recipe = "\n".join([CONFIGURE, *sorted(set(BUILD_REQUIREMENTS.values())), *ONE_BROKER_SOURCES,
                        _REPLICATION_FACTOR_3.pattern])
    return f"{NPM_PACKAGE}-{NPM_VERSION}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"


def build_root() -> Path:
    return build_cache_dir() / build_key()


def source_dir() -> Path:
    return build_root() / "package" / "deps" / "librdkafka"


def tests_dir() -> Path:
    return source_dir() / "tests"


def _stamp() -> Path:
    return build_root() / ".build-ok"


def is_built() -> bool:
    return _stamp().exists() and (tests_dir() / "test-runner").exists()


def ensure_built() -> Path:
    """Return the tests dir with a built `test-runner`, building it first if this version never was."""
    if is_built():
        return tests_dir()
    with exclusive_lock(build_cache_dir() / f"{build_key()}.lock"):
        if is_built():  # another run built it while we waited
            return tests_dir()
        ensure_debian_packages(BUILD_REQUIREMENTS)
        _fetch_and_unpack()
        _patch_for_one_broker()
        _build()
        _stamp().touch()
    return tests_dir()


def _fetch_and_unpack() -> None:
    cache = build_cache_dir()
    tarball = cache / f"{NPM_PACKAGE}-{NPM_VERSION}.tgz"
    if not tarball.exists():
        print(f"compat: npm pack {NPM_PACKAGE}@{NPM_VERSION}", flush=True)
        subprocess.run(
            ["npm", "pack", "--loglevel=error", f"{NPM_PACKAGE}@{NPM_VERSION}"], cwd=cache, check=True, stdout=subprocess.DEVNULL
        )
    root = build_root()
    shutil.rmtree(root, ignore_errors=True)  # a half-built tree from an interrupted run
    root.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(root, filter="data")
    if not (source_dir() / "configure").exists():
        raise RuntimeError(f"{tarball} does not bundle librdkafka sources at package/deps/librdkafka")


def _patch_for_one_broker() -> None:
    for name in ONE_BROKER_SOURCES:
        path = tests_dir() / name
        text, count = _REPLICATION_FACTOR_3.subn(r"\g<1>-1\g<2>", path.read_text())
        if count == 0:  # a new librdkafka version changed the test: look at it again
            raise RuntimeError(f"{path}: no topic created with replication factor 3 to change")
        path.write_text(text)


def _build() -> None:
    log_path = build_cache_dir() / f"build-{build_key()}.log"
    script = f"{CONFIGURE} && make -j2 libs && make -j2 -C tests build"
    print(f"compat: building librdkafka {LIBRDKAFKA_VERSION} and its test-runner (a few minutes); log {log_path}",
          flush=True)
    with open(log_path, "wb") as log:
        done = subprocess.run(["bash", "-c", script], cwd=source_dir(), stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        raise RuntimeError("librdkafka build failed:\n" + "\n".join(tail))
