"""Where the gate keeps its files.

Builds and downloads live outside the clone (CI starts from a fresh clone on the same machine, so a cache
inside the clone would be rebuilt every run). Per-run logs stay inside the clone, in the gitignored
`compat/.cache/`.
"""
from __future__ import annotations

import os
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parent
REPO_ROOT = COMPAT_DIR.parent


def build_cache_dir() -> Path:
    """Shared, versioned build/download cache: $KOP_COMPAT_CACHE or ~/.cache/kop-compat."""
    configured = os.environ.get("KOP_COMPAT_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "kop-compat"
    root.mkdir(parents=True, exist_ok=True)
    return root


def run_logs_dir() -> Path:
    """Logs of the latest run (broker log, one log per test), inside the clone and gitignored."""
    path = COMPAT_DIR / ".cache" / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path
