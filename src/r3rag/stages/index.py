"""`r3rag index`: build a retrieval index over a corpus into a versioned artifact.

The corpus comes from a world artifact (`world: world:latest`) or a JSONL file
(`corpus: path/to/corpus.jsonl`, FlashRAG `contents` or `{id,title,text}` rows); a corpus
file enters the config hash by its sha256, so editing it rebuilds the index and moving it does not.

Backends: `bm25` (bm25s; saves its tokenizer settings beside the index so queries are tokenised
exactly like the corpus), `rank-bm25` (the reference BM25), `dense` (a Hugging Face encoder +
faiss; `encoder: ""` = all-MiniLM-L6-v2) and `hybrid` (reciprocal-rank fusion of bm25 and dense).
For bm25 the corpus streams into an on-disk DocStore and the index builds from it in chunks, so
memory stays bounded at any corpus size; both are memory-mapped when served.

Usage:

    r3rag index --set world=world:latest
    r3rag index --set corpus=data/my_corpus.jsonl --set world=
    r3rag index --set backend=dense --set encoder=intfloat/e5-base-v2 \\
        --set 'query_prefix="query: "' --set 'passage_prefix="passage: "'
    r3rag index --set backend=dense --set index_type=ivf-pq --set refine_k=4 --set corpus=wiki-18.jsonl --set world=
    r3rag index --set backend=dense --set prebuilt_index=e5_Flat.index --set corpus=wiki-18.jsonl --set world= \\
        --set encoder=intfloat/e5-base-v2 --set 'query_prefix="query: "'     # Search-R1's index, as it is

BM25 at scale: the tokenised chunks wait in runs/index/.work-<id>/ too, so a killed build resumes
from the last finished chunk.

Dense at scale: encoding runs in resumable fp16 chunks (`chunk_size`; a killed build reruns from the
last finished chunk, kept in runs/index/.work-<id>/), the faiss index type is one setting (`index_type`,
with nlist / pq_m / nprobe / refine_k / train_size) and is memory-mapped when served.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from r3rag.core.artifacts import file_sha256, resolve, work_dir
from r3rag.data.corpus import load_corpus
from r3rag.stages.common import Context
from r3rag.util.errors import UserError

INPUTS = {"world": "world"}
BACKENDS = ("bm25", "rank-bm25", "dense", "hybrid")


@dataclass
class Config:
    name: str = "default"  # the artifact's name: runs/index/<name>-<hash>
    world: str = "world:latest"  # the world artifact whose corpus.jsonl is indexed ("" with corpus=)
    corpus: str = ""  # a corpus JSONL instead of a world (set world to "")
    backend: str = "bm25"  # bm25 | rank-bm25 | dense | hybrid
    # bm25 and rank-bm25 (and hybrid's bm25 side)
    stopwords: str | None = "en"
    stemmer: str | None = None  # a PyStemmer language ("english"); None = no stemming
    k1: float = 1.5  # BM25 term-frequency saturation
    b: float = 0.75  # BM25 document-length normalisation (0 = none, 1 = full)
    # dense (and hybrid's dense side)
    encoder: str = ""  # a local directory or hub id; "" = all-MiniLM-L6-v2
    pooling: Literal["mean", "cls"] = "mean"  # a passage vector: the mean of its token states or the first one
    query_prefix: str = ""  # E5: "query: "
    passage_prefix: str = ""  # E5: "passage: "
    normalize: bool = True  # unit-length vectors, so inner product = cosine
    index_type: Literal["flat", "hnsw", "ivf", "ivf-flat", "ivf-sq8", "ivf-pq"] = "flat"  # ivf = ivf-flat
    max_length: int = 256  # encoder tokens per passage or query; longer ones are cut
    batch_size: int = 64  # texts per encoder forward pass
    nlist: int = 0  # IVF lists; 0 = 4 * sqrt(passages)
    pq_m: int = 0  # ivf-pq bytes per passage code; 0 = the largest divisor of the dimension up to 64
    nprobe: int = 32  # IVF lists searched per query
    refine_k: int = 0  # re-rank k * refine_k candidates exactly from the fp16 vectors (kept as vectors.npy)
    train_size: int = 0  # vectors sampled to train IVF / SQ / PQ; 0 = 40 per list, at least 20k
    chunk_size: int = 50_000  # passages per resumable encoding shard
    gpu: Literal["auto", "never"] = "auto"  # faiss on every GPU faiss-gpu sees (auto) or on the CPU
    prebuilt_index: str = ""  # a FlashRAG / Search-R1 faiss file used as it is (corpus = its JSONL)
    # hybrid
    rrf_k: int = 60  # reciprocal rank fusion: a doc scores 1 / (rrf_k + rank) in each list
    candidates: int = 20  # docs each side retrieves before fusing (at least k)


def run(cfg: Config, ctx: Context):
    if cfg.backend not in BACKENDS:
        raise UserError(f"index.backend: unknown backend {cfg.backend!r} (available: {', '.join(BACKENDS)})")
    if cfg.prebuilt_index and cfg.backend != "dense":
        raise UserError(f"index: prebuilt_index is a dense faiss file; set backend=dense (not {cfg.backend})")
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
    with writer:
        t0 = time.time()
        if cfg.backend == "bm25":
            n_docs = build_bm25_on_disk(cfg, corpus_path, writer)
        elif cfg.backend == "dense":
            n_docs = build_dense_on_disk(cfg, corpus_path, writer)
        else:
            docs = load_corpus(corpus_path)
            build(cfg, docs).save(writer.dir / "index")
            n_docs = len(docs)
        writer.metrics.update(
            {
                "docs": n_docs,
                "build_seconds": round(time.time() - t0, 3),
                "corpus": str(corpus_path),
                "corpus_sha256": sha,
            }
        )
    if cfg.backend in ("bm25", "dense"):  # published: the chunks or shards it was built from are no longer needed
        shutil.rmtree(work_dir(writer.final), ignore_errors=True)
    return ctx.done(writer)


def build(cfg: Config, docs: list[dict]):
    """The configured backend's retriever over docs."""
    bm25 = {"stopwords": cfg.stopwords, "stemmer": cfg.stemmer, "k1": cfg.k1, "b": cfg.b}
    dense = dense_options(cfg)
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


def build_bm25_on_disk(cfg: Config, corpus_path: Path, writer) -> int:
    """bm25 at any corpus size: the corpus streams into a DocStore, the index builds from it in
    chunks (bounded memory) kept in runs/index/.work-<id>/ (a killed build resumes from them; removed
    once the index is written); both are memory-mapped when served. Returns the number of documents."""
    from r3rag.retrieval.bm25 import BM25Retriever
    from r3rag.retrieval.docstore import import_corpus

    out = writer.dir / "index"
    store = import_corpus(corpus_path, out / "docs")
    bm25 = {"stopwords": cfg.stopwords, "stemmer": cfg.stemmer, "k1": cfg.k1, "b": cfg.b}
    r = BM25Retriever.build_on_disk(store, out, work_dir=work_dir(writer.final), **bm25)
    writer.metrics.update(r.build_stats)  # tokenized_chunks < chunks: the build resumed
    return len(store)


def dense_options(cfg: Config) -> dict:
    """DenseRetriever.build's arguments from the config (the dense side of hybrid too)."""
    keys = ("encoder", "pooling", "query_prefix", "passage_prefix", "normalize", "index_type", "max_length")
    keys += ("batch_size", "nlist", "pq_m", "nprobe", "refine_k", "train_size", "chunk_size", "gpu")
    return {k: getattr(cfg, k) for k in keys}


def build_dense_on_disk(cfg: Config, corpus_path: Path, writer) -> int:
    """dense at any corpus size: the corpus streams into a DocStore; passages are encoded in fp16 shards
    kept in runs/index/.work-<id>/ (a killed build resumes from them; removed once the index is
    published); the index is trained on a sample and filled shard by shard. Or, with prebuilt_index,
    a FlashRAG / Search-R1 faiss file is checked against the corpus and encoder and used as it is."""
    from r3rag.retrieval.dense import DenseRetriever
    from r3rag.retrieval.docstore import import_corpus

    out = writer.dir / "index"
    if cfg.prebuilt_index:
        from r3rag.retrieval.prebuilt import write_prebuilt

        query = {k: getattr(cfg, k) for k in ("pooling", "query_prefix", "passage_prefix", "normalize", "max_length")}
        return len(write_prebuilt(out, Path(cfg.prebuilt_index), corpus_path, cfg.encoder, **query).docs)
    work = work_dir(writer.final)
    store = import_corpus(corpus_path, out / "docs")
    r = DenseRetriever.build(store, work_dir=work, **dense_options(cfg))
    r.save(out)
    seconds, encoded = r.build_stats["encode_seconds"], r.build_stats["encoded_passages"]
    writer.metrics.update(
        {
            "encoded_chunks": r.build_stats["encoded_chunks"],
            "chunks": r.build_stats["chunks"],
            "encode_passages_per_second": round(encoded / seconds, 1) if seconds and encoded else None,
            "index_bytes_per_passage": round((out / "faiss.index").stat().st_size / max(len(store), 1), 1),
        }
    )
    return len(store)


def corpus_sha256(path: Path) -> str:
    if not path.is_file():
        raise UserError(f"{path}: corpus file not found")
    return file_sha256(path)
