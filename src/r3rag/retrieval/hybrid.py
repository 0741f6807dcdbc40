"""Hybrid retrieval: reciprocal-rank fusion of BM25 and dense results over the same docs.

A doc's fused score is the sum over the two lists of 1 / (rrf_k + rank), rank counted from 1
(Cormack et al. 2009, rrf_k = 60). Each side retrieves max(k, candidates) docs first.

Usage:
    r = HybridRetriever.build(docs, dense={"encoder": "", "index_type": "flat"}, bm25={"stopwords": "en"})
    r.save(index_dir); r = HybridRetriever.load(index_dir)   # sub-indexes in bm25/ and dense/
    r.search(["who founded Zentro Labs"], k=5)
"""

from __future__ import annotations

import json
from pathlib import Path

from r3rag.core.protocol import Hit
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.retrieval.dense import DenseRetriever
from r3rag.util.jsonl import read_jsonl, write_jsonl


def rrf_fuse(ranked_lists: list[list[Hit]], k: int, rrf_k: int = 60) -> list[Hit]:
    """Fuse ranked hit lists by doc id; ties go to the doc seen earliest (list order, then rank)."""
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for hits in ranked_lists:
        for rank, h in enumerate(hits, start=1):
            scores[h.doc_id] = scores.get(h.doc_id, 0.0) + 1.0 / (rrf_k + rank)
            first.setdefault(h.doc_id, h)
    order = sorted(first, key=lambda d: -scores[d])  # sorted() is stable: ties keep first-seen order
    return [Hit(d, scores[d], first[d].title, first[d].text) for d in order[:k]]


class HybridRetriever:
    def __init__(self, sparse, dense, docs: list[dict], settings: dict):
        self.sparse, self.dense, self.docs, self.settings = sparse, dense, docs, settings

    @classmethod
    def build(
        cls,
        docs: list[dict],
        bm25: dict | None = None,
        dense: dict | None = None,
        rrf_k: int = 60,
        candidates: int = 20,
    ):
        settings = {"backend": "hybrid", "rrf_k": rrf_k, "candidates": candidates, "num_docs": len(docs)}
        return cls(
            BM25Retriever.build(docs, **(bm25 or {})), DenseRetriever.build(docs, **(dense or {})), docs, settings
        )

    def save(self, index_dir: Path) -> None:
        index_dir.mkdir(parents=True, exist_ok=True)
        self.sparse.save(index_dir / "bm25")
        self.dense.save(index_dir / "dense")
        write_jsonl(index_dir / "docs.jsonl", self.docs)
        (index_dir / "settings.json").write_text(json.dumps(self.settings, indent=2))

    @classmethod
    def load(cls, index_dir: Path):
        settings = json.loads((index_dir / "settings.json").read_text())
        return cls(
            BM25Retriever.load(index_dir / "bm25"),
            DenseRetriever.load(index_dir / "dense"),
            read_jsonl(index_dir / "docs.jsonl"),
            settings,
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.docs))
        n = max(k, self.settings["candidates"])
        sparse, dense = self.sparse.search(queries, n), self.dense.search(queries, n)
        return [rrf_fuse([s, d], k, self.settings["rrf_k"]) for s, d in zip(sparse, dense)]
