"""JAX stays out of bm25s without breaking `datasets` (on a machine where JAX is installed, as on
GPU images): a stand-in `jax` distribution on the path makes datasets believe JAX is there."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# datasets imported first (as TRL does in the RL stage), then bm25s through r3rag: Dataset.from_dict
# must still work, and bm25s must not have imported the stand-in.
SCRIPT = """
import sys
import datasets
assert datasets.config.JAX_AVAILABLE, "the stand-in jax was not seen"
import r3rag.retrieval.bm25
assert sys.modules["jax"] is None, "bm25s imported jax"
print(list(datasets.Dataset.from_dict({"prompt": ["a", "b"]})["prompt"]))
"""


def fake_jax(site: Path) -> None:
    for name in ("jax", "jaxlib"):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("raise ImportError('the stand-in jax must not be imported')\n")
        info = site / f"{name}-0.4.30.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.4.30\n")


def test_datasets_still_builds_tables_after_jax_is_blocked(tmp_path: Path) -> None:
    fake_jax(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("USE_JAX", None)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['a', 'b']"
