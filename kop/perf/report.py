"""The JSON document of a run: what was asked, each per-second sample, and the summary."""
from __future__ import annotations

import dataclasses
import json
import math
import sys

from kop.perf.stats import Latency, Sample, Totals


SECRET_WORDS = ("password", "secret", "jaas", "token", "key.pem", "keystore", "credentials")


def redacted(config: dict[str, str]) -> dict[str, str]:
    """Client settings fit to write down: a SASL password or a private key passed as a property is not."""
    return {k: "[redacted]" if any(word in k.lower() for word in SECRET_WORDS) else v for k, v in config.items()}


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 6)


def _latency(latency: Latency | None) -> dict | None:
    return None if latency is None else {k: _number(v) for k, v in dataclasses.asdict(latency).items()}


def sample_json(sample: Sample) -> dict:
    return {"time_s": _number(sample.time_s), "interval_s": _number(sample.seconds), "records": sample.records,
            "bytes": sample.bytes, "records_per_s": _number(sample.records_per_s),
            "mb_per_s": _number(sample.mb_per_s), "latency_ms": _latency(sample.latency)}


def totals_json(totals: Totals) -> dict:
    return {"records": totals.records, "bytes": totals.bytes, "elapsed_s": _number(totals.seconds),
            "records_per_s": _number(totals.records_per_s), "mb_per_s": _number(totals.mb_per_s),
            "latency_ms": _latency(totals.latency)}


def write_json(path: str, document: dict) -> None:
    text = json.dumps(document, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(path, "w") as f:
            f.write(text)
