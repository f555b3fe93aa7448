"""Download kafka-python's sdist with pip, unpack it once, and lay the shim over its test/ dir."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from compat.paths import build_cache_dir
from compat.system import exclusive_lock

PACKAGE = "kafka-python"
VERSION = "3.0.12"
SHIM_DIR = Path(__file__).resolve().parent / "shim"
# shim file -> where it goes in the sdist
SHIM_FILES = {"__init__.py": "test/__init__.py", "conftest.py": "test/conftest.py", "service.py": "test/service.py",
              "kop_fixture.py": "test/kop_fixture.py"}


def sdist_root() -> Path:
    return build_cache_dir() / f"kafka_python-{VERSION}"


def ensure_sdist() -> Path:
    """Return the unpacked sdist with the shim in place (the shim is recopied every run: it may change)."""
    root = sdist_root()
    with exclusive_lock(build_cache_dir() / f"kafka_python-{VERSION}.lock"):
        if not (root / "test" / "integration" / "conftest.py").exists():
            _download_and_unpack()
        for source, target in SHIM_FILES.items():
            shutil.copyfile(SHIM_DIR / source, root / target)
    return root


def _download_and_unpack() -> None:
    cache = build_cache_dir()
    tarball = cache / f"kafka_python-{VERSION}.tar.gz"
    if not tarball.exists():
        print(f"compat: pip download {PACKAGE}=={VERSION} (sdist)", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
             f"{PACKAGE}=={VERSION}", "-d", str(cache)],
            check=True,
        )
    shutil.rmtree(sdist_root(), ignore_errors=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(cache, filter="data")
    if not (sdist_root() / "test" / "integration").is_dir():
        raise RuntimeError(f"{tarball} has no test/integration/")
