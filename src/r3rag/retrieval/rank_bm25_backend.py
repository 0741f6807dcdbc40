"""BM25 with rank_bm25's `BM25Okapi`: the slow, simple reference that the bm25s backend is checked against.

Tokenisation is the bm25 backend's (bm25s.tokenize, same stopwords, stemmer and lowercasing), so the two
rank alike; they still differ slightly because Okapi's idf is log((N-df+.5)/(df+.5)) with a floor, while
bm25s' "lucene" idf is log(1 + (N-df+.5)/(df+.5)).

Usage:
    r = RankBM25Retriever.build(docs, stopwords="en")
    r.save(index_dir); r = RankBM25Retriever.load(index_dir)
    r.search(["Zentro Labs headquartered"], k=3)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from r3rag.core.protocol import Hit
from r3rag.retrieval.bm25 import bm25s
from r3rag.retrieval.bm25_build import stemmer_of as _stemmer
from r3rag.util.extras import require
from r3rag.util.jsonl import read_jsonl, write_jsonl

if TYPE_CHECKING:
    from rank_bm25 import BM25Okapi


def _tokenize(texts: list[str], settings: dict) -> list[list[str]]:
    return bm25s.tokenize(
        list(texts),
        stopwords=settings["stopwords"],
        stemmer=_stemmer(settings["stemmer"]),
        return_ids=False,
        show_progress=False,
    )


class RankBM25Retriever:
    def __init__(self, model: BM25Okapi, docs: list[dict], settings: dict):
        self.model, self.docs, self.settings = model, docs, settings

    @classmethod
    def build(
        cls,
        docs: list[dict],
        stopwords: str | None = "en",
        stemmer: str | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        epsilon: float = 0.25,
    ):
        okapi = require("rank_bm25", "rank-bm25", "index backend=rank-bm25").BM25Okapi
        settings = {
            "backend": "rank-bm25",
            "stopwords": stopwords,
            "stemmer": stemmer,
            "k1": k1,
            "b": b,
            "epsilon": epsilon,
            "lower": True,
            "num_docs": len(docs),
        }
        tokens = _tokenize([f"{d['title']} {d['text']}" for d in docs], settings)
        return cls(okapi(tokens, k1=k1, b=b, epsilon=epsilon), docs, settings)

    def save(self, index_dir: Path) -> None:
        # rank_bm25 has no on-disk format (pickling ties the file to its version): keep the settings and
        # docs, and rebuild on load, which takes seconds for corpora this backend is meant for.
        index_dir.mkdir(parents=True, exist_ok=True)
        write_jsonl(index_dir / "docs.jsonl", self.docs)
        (index_dir / "settings.json").write_text(json.dumps(self.settings, indent=2))

    @classmethod
    def load(cls, index_dir: Path):
        s = json.loads((index_dir / "settings.json").read_text())
        return cls.build(
            read_jsonl(index_dir / "docs.jsonl"),
            stopwords=s["stopwords"],
            stemmer=s["stemmer"],
            k1=s["k1"],
            b=s["b"],
            epsilon=s["epsilon"],
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.docs))
        out = []
        for tokens in _tokenize(queries, self.settings):
            scores = self.model.get_scores(tokens)
            top = np.argsort(-scores, kind="stable")[:k]  # stable: ties keep corpus order
            out.append(
                [
                    Hit(self.docs[i]["id"], float(scores[i]), self.docs[i]["title"], self.docs[i]["text"])
                    for i in top.tolist()
                ]
            )
        return out
