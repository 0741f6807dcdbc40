"""BM25 over a corpus with bm25s; the tokenizer settings are saved with the index.

Queries are always tokenised with the same settings as the corpus (FlashRAG's BM25 branch
stems the corpus but not the queries; saving the settings makes that impossible here).

Usage:
    r = BM25Retriever.build(docs, stopwords="en", stemmer=None)
    r.save(index_dir); r = BM25Retriever.load(index_dir)
    r.search(["Zentro Labs headquartered"], k=3)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from r3rag.jsonl import read_jsonl, write_jsonl
from r3rag.protocol import Hit

# bm25s imports JAX when present; forking after that deadlocks (seen on GPU machines).
sys.modules.setdefault("jax", None)
import bm25s  # noqa: E402


def _stemmer(name: str | None):
    if not name:
        return None
    try:
        import Stemmer
    except ImportError:
        from r3rag.errors import UserError

        raise UserError("bm25 stemmer requires the PyStemmer package (pip install PyStemmer)") from None
    return Stemmer.Stemmer(name).stemWord


class BM25Retriever:
    def __init__(self, model: "bm25s.BM25", docs: list[dict], settings: dict):
        self.model, self.docs, self.settings = model, docs, settings

    @classmethod
    def build(cls, docs: list[dict], stopwords: str | None = "en", stemmer: str | None = None,
              k1: float = 1.5, b: float = 0.75, method: str = "lucene"):
        settings = {"backend": "bm25", "stopwords": stopwords, "stemmer": stemmer, "k1": k1, "b": b,
                    "method": method, "lower": True, "num_docs": len(docs)}
        texts = [f"{d['title']} {d['text']}" for d in docs]
        tokens = bm25s.tokenize(texts, stopwords=stopwords, stemmer=_stemmer(stemmer), show_progress=False)
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index(tokens, show_progress=False)
        return cls(model, docs, settings)

    def save(self, index_dir: Path) -> None:
        index_dir.mkdir(parents=True, exist_ok=True)
        self.model.save(str(index_dir / "bm25"))
        write_jsonl(index_dir / "docs.jsonl", self.docs)
        (index_dir / "settings.json").write_text(json.dumps(self.settings, indent=2))

    @classmethod
    def load(cls, index_dir: Path, mmap: bool = True):
        settings = json.loads((index_dir / "settings.json").read_text())
        model = bm25s.BM25.load(str(index_dir / "bm25"), mmap=mmap)
        return cls(model, read_jsonl(index_dir / "docs.jsonl"), settings)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.docs))
        tokens = bm25s.tokenize(list(queries), stopwords=self.settings["stopwords"],
                                stemmer=_stemmer(self.settings["stemmer"]), return_ids=False, show_progress=False)
        idx, scores = self.model.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        out = []
        for row_idx, row_scores in zip(idx, scores):
            out.append([Hit(self.docs[i]["id"], float(s), self.docs[i]["title"], self.docs[i]["text"])
                        for i, s in zip(row_idx.tolist(), row_scores.tolist())])
        return out
