"""Builds the Java Kafka client harness that the integration tests drive.

The official kafka-clients jar is not on PyPI by itself; the wheel pinned below ships kafka-clients 3.9.1 together
with the libraries it loads at run time (lz4, snappy and zstd codecs, slf4j-api, and Jackson, which its OAUTHBEARER
login reads and writes tokens with). The build downloads that wheel
with pip, extracts those jars into build/java/lib/, and compiles integration/java/ into build/java/classes/.

`python -m integration.java_harness build` is idempotent: each step is skipped while its output is up to date.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

WHEEL_PROJECT = "shigawire-apache-flink-libraries"
WHEEL_VERSION = "2.0.0.post1"
WHEEL_FILE = "shigawire_apache_flink_libraries-2.0.0.post1-py3-none-any.whl"
WHEEL_SHA256 = "aaa65537d3f0c0ff279185d8243024f0efd95788ba044bf249ba0f40b69289cd"
WHEEL_JAR_DIR = "pyflink/lib/"
# kafka-clients and what it needs at run time; the rest of the wheel (Flink itself) is left packed.
WHEEL_JARS = ("kafka-clients.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar", "slf4j-api.jar",
              "jackson-databind.jar", "jackson-core.jar", "jackson-annotations.jar")
JAVA_RELEASE = "17"

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO_ROOT / "integration" / "java"
BUILD_DIR = REPO_ROOT / "build" / "java"
WHEEL_DIR = BUILD_DIR / "wheel"
LIB_DIR = BUILD_DIR / "lib"
CLASSES_DIR = BUILD_DIR / "classes"
STAMP_NAME = ".stamp"


class HarnessBuildError(RuntimeError):
    """The harness could not be built; the message says which step failed and why."""


@dataclass(frozen=True, slots=True)
class BuildReport:
    downloaded: bool
    extracted_jars: int
    compiled_sources: int

    @property
    def did_nothing(self) -> bool:
        return not self.downloaded and self.extracted_jars == 0 and self.compiled_sources == 0

    def summary(self) -> str:
        where = BUILD_DIR.relative_to(REPO_ROOT)
        if self.did_nothing:
            return f"java harness: up to date in {where}"
        steps = []
        if self.downloaded:
            steps.append(f"downloaded {WHEEL_PROJECT} {WHEEL_VERSION}")
        if self.extracted_jars:
            steps.append(f"extracted {self.extracted_jars} jars")
        if self.compiled_sources:
            steps.append(f"compiled {self.compiled_sources} sources")
        return f"java harness: {', '.join(steps)} into {where}"


def classpath() -> str:
    """The classpath that runs the harness: our classes, then every extracted jar."""
    return os.pathsep.join([str(CLASSES_DIR), str(LIB_DIR / "*")])


def build() -> BuildReport:
    """Brings build/java/ up to date; safe to call from several processes at once."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(BUILD_DIR / ".lock"):
        downloaded, extracted = _ensure_jars()
        compiled = _ensure_classes()
    return BuildReport(downloaded=downloaded, extracted_jars=extracted, compiled_sources=compiled)


def _ensure_jars() -> tuple[bool, int]:
    wanted = f"{WHEEL_FILE} sha256={WHEEL_SHA256} jars={','.join(WHEEL_JARS)}\n"
    if _read_stamp(LIB_DIR) == wanted and all((LIB_DIR / jar).is_file() for jar in WHEEL_JARS):
        return False, 0
    wheel, downloaded = _ensure_wheel()
    staging = BUILD_DIR / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with zipfile.ZipFile(wheel) as archive:
            for jar in WHEEL_JARS:
                with archive.open(WHEEL_JAR_DIR + jar) as source, open(staging / jar, "wb") as target:
                    shutil.copyfileobj(source, target)
    except (KeyError, zipfile.BadZipFile) as error:
        raise HarnessBuildError(f"cannot extract the jars from {wheel}: {error}") from error
    (staging / STAMP_NAME).write_text(wanted)
    _replace_dir(staging, LIB_DIR)
    return downloaded, len(WHEEL_JARS)


def _ensure_wheel() -> tuple[Path, bool]:
    wheel = WHEEL_DIR / WHEEL_FILE
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel, False
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--dest", str(WHEEL_DIR), f"{WHEEL_PROJECT}=={WHEEL_VERSION}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise HarnessBuildError(
            f"pip could not download {WHEEL_PROJECT}=={WHEEL_VERSION}:\n{_tail(result.stderr or result.stdout)}"
        )
    if not wheel.is_file():
        raise HarnessBuildError(f"pip finished but {wheel} is missing")
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise HarnessBuildError(f"{WHEEL_FILE} has sha256 {digest}, expected {WHEEL_SHA256}")
    return wheel, True


def _ensure_classes() -> int:
    sources = sorted(SOURCE_DIR.rglob("*.java"))
    if not sources:
        raise HarnessBuildError(f"no Java sources under {SOURCE_DIR}")
    javac = shutil.which("javac")
    if javac is None:
        raise HarnessBuildError(
            f"javac not found on PATH: install a JDK {JAVA_RELEASE}+ (Debian: openjdk-17-jdk-headless)"
        )
    fingerprint = _sources_fingerprint(sources, javac)
    if _read_stamp(CLASSES_DIR) == fingerprint:
        return 0
    staging = BUILD_DIR / "classes.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    command = [
        javac, "--release", JAVA_RELEASE, "-encoding", "UTF-8", "-Xlint:all",
        "-d", str(staging), "-cp", str(LIB_DIR / "*"), *map(str, sources),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise HarnessBuildError(f"javac failed:\n{_tail(result.stderr or result.stdout)}")
    (staging / STAMP_NAME).write_text(fingerprint)
    _replace_dir(staging, CLASSES_DIR)
    return len(sources)


def _sources_fingerprint(sources: list[Path], javac: str) -> str:
    """Content-based, so a checkout that only touches mtimes does not force a recompile."""
    digest = hashlib.sha256()
    digest.update(f"{javac} release={JAVA_RELEASE}\n{_read_stamp(LIB_DIR)}".encode())
    for source in sources:
        digest.update(str(source.relative_to(SOURCE_DIR)).encode() + b"\0")
        digest.update(source.read_bytes() + b"\0")
    return digest.hexdigest() + "\n"


def _replace_dir(staging: Path, target: Path) -> None:
    # Built aside and swapped in, so an interrupted build never leaves a half-filled directory with a valid stamp.
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _read_stamp(directory: Path) -> str | None:
    try:
        return (directory / STAMP_NAME).read_text()
    except OSError:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.java_harness", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="download the client jars and compile the harness (skipped if up to date)")
    commands.add_parser("classpath", help="print the classpath that runs the built harness")
    args = parser.parse_args(argv)
    if args.command == "classpath":
        print(classpath())
        return 0
    try:
        report = build()
    except HarnessBuildError as error:
        print(f"java harness: build failed: {error}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
