"""Optional dependencies: import one where a feature needs it, or stop with one line naming the extra.

`pip install r3rag` runs every stage with BM25 retrieval. The extras (pyproject.toml) add:

    [dense]      faiss-cpu          index backend=dense|hybrid
    [rank-bm25]  rank-bm25          index backend=rank-bm25 (the reference BM25)
    [server]     fastapi, uvicorn   r3rag serve-retriever
    [plots]      matplotlib         report's em_f1.png, rl's reward_curves.png, an experiment's table.png
    [real]       gguf               import-model from a GGUF file (SmolLM2-135M-Instruct)
    [vllm]       vllm (via TRL)     rl.vllm=colocate|server, eval.backend=vllm (GPU; on the CPU: make install-vllm)

Every import of these goes through `require`, inside the function that needs it, so importing
any r3rag module (and `r3rag --help`) works without them.

Usage:
    faiss = require("faiss", "dense", "index backend=dense")
    plt = pyplot("r3rag report")                      # the Agg backend: files only
    plt = pyplot_or_skip("reward_curves.png")         # None (and a note) without [plots]
    if installed("vllm"): ...
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from r3rag.util.errors import UserError

# The pip name where it differs from the import name.
PACKAGES = {"faiss": "faiss-cpu", "rank_bm25": "rank-bm25"}


def missing(module: str, extra: str, feature: str) -> UserError:
    """The one-line error for a feature whose optional package is not installed."""
    top = module.split(".")[0]
    return UserError(f"{feature} needs the optional package {PACKAGES.get(top, top)}: pip install 'r3rag[{extra}]'")


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`module` imported, or a UserError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        # Only the package itself missing is the user's missing extra; an installed package that
        # fails on one of its own imports is a broken install, and its error says more.
        if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:
            raise
        raise missing(module, extra, feature) from e


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (vLLM takes seconds to import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or a half-imported module
        return False


def pyplot(feature: str) -> ModuleType:
    """matplotlib.pyplot on the Agg backend (files only: no display needed), or the [plots] error."""
    matplotlib = require("matplotlib", "plots", feature)
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def pyplot_or_skip(output: str) -> ModuleType | None:
    """pyplot, or None after one note on stderr: for a plot that is a by-product of a long stage
    (rl's reward curves), which should not fail after the work is done."""
    try:
        return pyplot(f"the plot {output}")
    except UserError as e:
        print(f"note: {e} (skipped)", file=sys.stderr)
        return None
