"""kcat (Debian's, linked against librdkafka 2.0.2, which misreads tagged fields holding default values) lists
metadata, produces and consumes against kop."""
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (make test installs it)")


def kcat(broker, *args, input_=None, timeout=30):
    return subprocess.run(["kcat", "-b", broker.bootstrap, *args], input=input_, capture_output=True,
                          timeout=timeout, check=False)


def test_kcat_metadata_produce_consume(broker):
    lines = b"".join(b"key%d:value%d\n" % (i, i) for i in range(25))
    produced = kcat(broker, "-P", "-t", "kcat-topic", "-K:", "-p", "0", "-z", "snappy", input_=lines)
    assert produced.returncode == 0, produced.stderr.decode()
    meta = kcat(broker, "-L", "-t", "kcat-topic")
    assert meta.returncode == 0, meta.stderr.decode()
    assert b'topic "kcat-topic" with 1 partitions' in meta.stdout
    consumed = kcat(broker, "-C", "-t", "kcat-topic", "-o", "beginning", "-e", "-f", "%k=%s@%o\n")
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.splitlines() == [b"key%d=value%d@%d" % (i, i, i) for i in range(25)]
