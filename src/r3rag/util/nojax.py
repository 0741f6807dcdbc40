"""Keep JAX out of this process, for every library that looks for it.

bm25s imports JAX when it is installed (GPU images have it), and a process that has imported JAX
deadlocks when it forks. Marking `jax` absent in `sys.modules` stops the import, but `datasets`
decides once, when first imported, that JAX is available, and later takes `"jax" in sys.modules`
to mean it may `import jax.numpy`: with the mark in place that fails (seen on the H200 when the RL
stage imported datasets, through TRL, before bm25s). So the mark goes with datasets' own switch.

    from r3rag.util.nojax import block_jax
    block_jax()  # before importing bm25s
"""

from __future__ import annotations

import os
import sys


def block_jax() -> None:
    """Mark JAX absent for this process (no-op for a process that already imported it)."""
    sys.modules.setdefault("jax", None)
    os.environ.setdefault("USE_JAX", "0")  # datasets reads it when first imported
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None and sys.modules["jax"] is None:
        datasets_config.JAX_AVAILABLE = False  # already imported: it would try `import jax.numpy`
