"""Where the real QA sets and corpora live (a checkout's `../shared/data`, or `$R3RAG_DATA`).

Tests and benchmarks that need them call `shared_data()` and skip with one line when it
returns None (a user's fresh clone has no `../shared`).

Usage:
    root = shared_data()      # Path or None
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]


def shared_data() -> Path | None:
    env = os.environ.get("R3RAG_DATA")
    candidates = [Path(env)] if env else [_REPO.parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    return None
