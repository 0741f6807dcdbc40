"""`r3rag index`: build a retrieval index over a corpus into a versioned artifact.

The corpus comes from a world artifact (`world: world:latest`) or a JSONL file
(`corpus: path/to/corpus.jsonl`, FlashRAG `contents` or `{id,title,text}` rows); a corpus
file enters the config hash by its sha256, so editing it rebuilds the index and moving it does not.

Backends: `bm25` (bm25s; saves its tokenizer settings beside the index so queries are tokenised
exactly like the corpus), `rank-bm25` (the reference BM25), `dense` (a Hugging Face encoder +
faiss; `encoder: ""` = all-MiniLM-L6-v2) and `hybrid` (reciprocal-rank fusion of bm25 and dense).

Usage:

    r3rag index --set world=world:latest
    r3rag index --set corpus=data/my_corpus.jsonl --set world=
    r3rag index --set backend=dense --set encoder=intfloat/e5-base-v2 \\
        --set query_prefix="query: " --set passage_prefix="passage: "
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from r3rag.artifacts import file_sha256, resolve
from r3rag.data.corpus import load_corpus
from r3rag.errors import UserError
from r3rag.stages.common import Context

INPUTS = {"world": "world"}
BACKENDS = ("bm25", "rank-bm25", "dense", "hybrid")


@dataclass
class Config:
    name: str = "default"
    world: str = "world:latest"
    corpus: str = ""  # a corpus JSONL instead of a world (set world to "")
    backend: str = "bm25"  # bm25 | rank-bm25 | dense | hybrid
    # bm25 and rank-bm25 (and hybrid's bm25 side)
    stopwords: str | None = "en"
    stemmer: str | None = None
    k1: float = 1.5
    b: float = 0.75
    # dense (and hybrid's dense side)
    encoder: str = ""  # a local directory or hub id; "" = all-MiniLM-L6-v2
    pooling: Literal["mean", "cls"] = "mean"
    query_prefix: str = ""  # E5: "query: "
    passage_prefix: str = ""  # E5: "passage: "
    normalize: bool = True
    index_type: Literal["flat", "hnsw", "ivf"] = "flat"
    max_length: int = 256
    batch_size: int = 64
    # hybrid
    rrf_k: int = 60
    candidates: int = 20


def run(cfg: Config, ctx: Context):
    if cfg.backend not in BACKENDS:
        raise UserError(f"index.backend: unknown backend {cfg.backend!r} (available: {', '.join(BACKENDS)})")
    if cfg.world and cfg.corpus:
        raise UserError("index: set either world or corpus, not both (add --set world= to index a corpus file)")
    inputs = {"world": resolve(cfg.world, "world", ctx.runs_dir)} if cfg.world else {}
    if not inputs and not cfg.corpus:
        raise UserError("index: set either world (an artifact) or corpus (a JSONL file)")
    corpus_path = inputs["world"].path / "corpus.jsonl" if inputs else Path(cfg.corpus)
    sha = corpus_sha256(corpus_path)
    # Hash the corpus file by content, not by path; the manifest keeps the path as given.
    hashed = dataclasses.replace(cfg, corpus=f"sha256:{sha}") if cfg.corpus else cfg
    writer = ctx.writer("index", hashed, inputs, INPUTS)
    writer.config = dataclasses.asdict(cfg)
    if writer.existing:
        return ctx.skipped(writer)
    docs = load_corpus(corpus_path)
    with writer:
        t0 = time.time()
        build(cfg, docs).save(writer.dir / "index")
        writer.metrics.update(
            {
                "docs": len(docs),
                "build_seconds": round(time.time() - t0, 3),
                "corpus": str(corpus_path),
                "corpus_sha256": sha,
            }
        )
    return ctx.done(writer)


def build(cfg: Config, docs: list[dict]):
    """The configured backend's retriever over docs."""
    bm25 = {"stopwords": cfg.stopwords, "stemmer": cfg.stemmer, "k1": cfg.k1, "b": cfg.b}
    dense = {
        "encoder": cfg.encoder,
        "pooling": cfg.pooling,
        "query_prefix": cfg.query_prefix,
        "passage_prefix": cfg.passage_prefix,
        "normalize": cfg.normalize,
        "index_type": cfg.index_type,
        "max_length": cfg.max_length,
        "batch_size": cfg.batch_size,
    }
    match cfg.backend:
        case "bm25":
            from r3rag.retrieval.bm25 import BM25Retriever

            return BM25Retriever.build(docs, **bm25)
        case "rank-bm25":
            from r3rag.retrieval.rank_bm25_backend import RankBM25Retriever

            return RankBM25Retriever.build(docs, **bm25)
        case "dense":
            from r3rag.retrieval.dense import DenseRetriever

            return DenseRetriever.build(docs, **dense)
        case "hybrid":
            from r3rag.retrieval.hybrid import HybridRetriever

            return HybridRetriever.build(docs, bm25=bm25, dense=dense, rrf_k=cfg.rrf_k, candidates=cfg.candidates)


def corpus_sha256(path: Path) -> str:
    if not path.is_file():
        raise UserError(f"{path}: corpus file not found")
    return file_sha256(path)
