"""Where the real QA sets and corpora live: `$R3RAG_DATA`, else the copy `r3rag data fetch`
(`make data`) downloads from the Hugging Face hub (`data/fetched` in a checkout).

Nothing else is looked for: a folder that happens to sit beside the clone is never read unasked.
The test suite and CI point `$R3RAG_DATA` at the offline copy they use themselves.

Tests and benchmarks that need the data call `shared_data()` and skip with one line when it
returns None (a user's fresh clone has none until `make data`).

Usage:
    root = shared_data()      # Path or None: where the pipelines' `world.source=files` reads
    fetch_root()              # where `r3rag data fetch` writes: $R3RAG_DATA, else the fetched copy
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]


def fetched_default() -> Path:
    """`data/fetched` in a source checkout; else (an installed package) the user's cache."""
    if (_REPO / "pyproject.toml").is_file():
        return _REPO / "data" / "fetched"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "r3rag" / "data"


def fetch_root() -> Path:
    env = os.environ.get("R3RAG_DATA")
    return Path(env).expanduser() if env else fetched_default()


def shared_data() -> Path | None:
    env = os.environ.get("R3RAG_DATA")
    if env:
        return Path(env).expanduser() if Path(env).expanduser().is_dir() else None
    fetched = fetched_default()
    # Once a fetch has written something (its lock file): an attempt that never reached the hub leaves none.
    return fetched if (fetched / "flashrag.lock.json").is_file() else None
