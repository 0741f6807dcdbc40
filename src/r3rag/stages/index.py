"""`r3rag index`: build a retrieval index over a corpus into a versioned artifact.

The corpus comes from a world artifact (`world: world:latest`) or a JSONL file
(`corpus: path/to/corpus.jsonl`, FlashRAG `contents` or `{id,title,text}` rows).
BM25 (bm25s) saves its tokenizer settings beside the index so queries are tokenised
exactly like the corpus.

Usage:

    r3rag index --set world=world:latest
    r3rag index --set corpus=data/my_corpus.jsonl --set world=
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from r3rag.artifacts import resolve
from r3rag.data.corpus import load_corpus
from r3rag.errors import UserError
from r3rag.stages.common import Context

INPUTS = {"world": "world"}


@dataclass
class Config:
    name: str = "default"
    world: str = "world:latest"
    corpus: str = ""  # a corpus JSONL instead of a world (set world to "")
    backend: str = "bm25"
    stopwords: str | None = "en"
    stemmer: str | None = None
    k1: float = 1.5
    b: float = 0.75


def run(cfg: Config, ctx: Context):
    if cfg.backend != "bm25":
        raise UserError(f"index.backend: unknown backend {cfg.backend!r} (available: bm25)")
    inputs = {"world": resolve(cfg.world, "world", ctx.runs_dir)} if cfg.world else {}
    if not inputs and not cfg.corpus:
        raise UserError("index: set either world (an artifact) or corpus (a JSONL file)")
    corpus_path = inputs["world"].path / "corpus.jsonl" if inputs else cfg.corpus
    writer = ctx.writer("index", cfg, inputs, INPUTS)
    if writer.existing and not cfg.corpus:
        return ctx.skipped(writer)
    docs = load_corpus(corpus_path)
    from r3rag.retrieval.bm25 import BM25Retriever

    with writer:
        t0 = time.time()
        retriever = BM25Retriever.build(docs, stopwords=cfg.stopwords, stemmer=cfg.stemmer, k1=cfg.k1, b=cfg.b)
        retriever.save(writer.dir / "index")
        writer.metrics.update({"docs": len(docs), "build_seconds": round(time.time() - t0, 3),
                               "corpus": str(corpus_path)})
    return ctx.done(writer)
