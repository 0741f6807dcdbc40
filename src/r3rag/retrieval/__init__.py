"""Retrieval backends behind one interface: `search(queries, k) -> list[list[Hit]]`, always batched.

Usage:
    retriever = load_retriever(index_dir)        # reads index_dir/settings.json
    hits = retriever.search(["Ava Smith works"], k=3)
    retriever = open_retriever(cfg.retriever, inputs.get("index"))   # in a stage: URL or index artifact

The package holds BM25 (`bm25`, built in bounded memory by `bm25_build` and `bm25_score`;
`rank_bm25_backend`), dense (`dense`, `encode`, `faiss_index`), `hybrid`, the on-disk document store
(`docstore`), prebuilt indexes, the HTTP server and its client (`server`, `serving`, `remote`) and
retrieval metrics (`evaluate`). May import data/, core/ and util/.
"""

from __future__ import annotations

import json
from pathlib import Path

from r3rag.util.errors import UserError


def load_retriever(index_dir: str | Path):
    index_dir = Path(index_dir)
    settings_path = index_dir / "settings.json"
    if not settings_path.is_file():
        raise UserError(f"{index_dir}: not an index (no settings.json)")
    backend = json.loads(settings_path.read_text())["backend"]
    match backend:
        case "bm25":
            from r3rag.retrieval.bm25 import BM25Retriever

            return BM25Retriever.load(index_dir)
        case "rank-bm25":
            from r3rag.retrieval.rank_bm25_backend import RankBM25Retriever

            return RankBM25Retriever.load(index_dir)
        case "dense":
            from r3rag.retrieval.dense import DenseRetriever

            return DenseRetriever.load(index_dir)
        case "hybrid":
            from r3rag.retrieval.hybrid import HybridRetriever

            return HybridRetriever.load(index_dir)
        case _:
            raise UserError(f"{settings_path}: unknown retrieval backend {backend!r}")


def is_url(value: str | None) -> bool:
    return bool(value) and value.startswith(("http://", "https://"))


def open_retriever(url: str | None, index_ref=None):
    """A stage's retriever: the server at `url` when one is given, else the index artifact's index.

    `index_ref` is the index artifact (an ArtifactRef, or its directory); None when not resolved.
    """
    if url:
        if not is_url(url):
            raise UserError(f"retriever: {url!r} is not an http:// or https:// URL")
        from r3rag.retrieval.remote import RemoteRetriever

        return RemoteRetriever(url)
    if index_ref is None:
        raise UserError("no retriever: set index (an index artifact) or retriever (a server URL)")
    return load_retriever(Path(getattr(index_ref, "path", index_ref)) / "index")
