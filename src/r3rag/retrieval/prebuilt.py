"""A prebuilt FlashRAG / Search-R1 dense index, used as it is: its faiss file, its JSONL corpus, E5 queries.

Search-R1's `e5_Flat.index` (PeterJinGo/wiki-18-e5-index, with `wiki-18.jsonl`) and FlashRAG's own
were made by FlashRAG's index builder: corpus line i's `contents` ("\\"Title\\"\\ntext") embedded by
intfloat/e5-base-v2 as "passage: " + contents, mean-pooled over the attention mask, L2-normalised,
into faiss `index_factory(dim, "Flat", METRIC_INNER_PRODUCT)`; vector i is line i. Queries must be
embedded the same way, as Search-R1's retrieval server does: "query: " + question, mean pooling,
normalised, at most 256 tokens (`E5_QUERY`, the defaults here; an encoder whose name contains "e5"
gets the "query: " prefix even when none is set, as both projects choose it by model name).
Search-R1's HNSW64 index loads the same way.

Nothing is rebuilt: the corpus is imported once, streaming, into a DocStore (read by row), and the
faiss file is memory-mapped where it lies (65 GB for 21M x 768 fp32: it is not copied). An index
whose dimension is not the encoder's, or whose size is not the corpus's, is one clear line.

Usage:
    r = open_prebuilt("e5_Flat.index", "wiki-18.jsonl", "runs/wiki18-docs", encoder="intfloat/e5-base-v2")
    r.search(["who wrote Hamlet"], k=3)
    # or as an index artifact (what eval and serve-retriever load):
    r3rag index --set backend=dense --set world= --set corpus=wiki-18.jsonl \\
        --set prebuilt_index=e5_Flat.index --set encoder=intfloat/e5-base-v2 --set 'query_prefix="query: "'
"""

from __future__ import annotations

from pathlib import Path

from r3rag.retrieval.dense import DEFAULT_ENCODER, DenseRetriever
from r3rag.retrieval.docstore import DocStore, import_corpus
from r3rag.util.errors import UserError

# How Search-R1's retrieval server embeds a query for its E5 index (FlashRAG's settings for e5).
E5_QUERY = {
    "query_prefix": "query: ",
    "passage_prefix": "passage: ",
    "pooling": "mean",
    "normalize": True,
    "max_length": 256,
}


def open_docs_for(corpus: Path, docstore_dir: Path) -> DocStore:
    """The corpus as a DocStore: `corpus` itself when it is one, else imported once into docstore_dir."""
    corpus, docstore_dir = Path(corpus), Path(docstore_dir)
    if corpus.is_dir():
        return DocStore(corpus)
    if (docstore_dir / "meta.json").is_file():
        store = DocStore(docstore_dir)
        if (store.meta.get("source"), store.meta.get("source_bytes")) == (corpus.name, corpus.stat().st_size):
            return store
    return import_corpus(corpus, docstore_dir)


def prebuilt_settings(index_path: Path, encoder: str = "", **query) -> dict:
    """settings.json for a prebuilt index: where its faiss file is, and how queries are embedded."""
    index_path = Path(index_path).resolve()
    if not index_path.is_file():
        raise UserError(f"{index_path}: prebuilt faiss index file not found")
    q = {**E5_QUERY, "batch_size": 64, **query}
    if not q["query_prefix"] and "e5" in encoder.lower():  # as FlashRAG and Search-R1 pick it, by model name
        q["query_prefix"] = E5_QUERY["query_prefix"]
    return {
        "backend": "dense",
        "prebuilt": True,
        "faiss_index": str(index_path),
        "faiss_index_bytes": index_path.stat().st_size,  # a different file at the same path is caught at load
        "encoder": encoder or DEFAULT_ENCODER,
        **q,
        "nprobe": 32,
        "ef_search": 128,
        "refine_k": 0,
        "gpu": "auto",
    }


def open_prebuilt(index_path, corpus, docstore_dir, encoder: str = "", device: str | None = None, **query):
    """A DenseRetriever over a prebuilt faiss file and its corpus (JSONL, or a DocStore directory)."""
    s = prebuilt_settings(index_path, encoder, **query)
    return DenseRetriever.from_faiss_file(s, open_docs_for(corpus, docstore_dir), device, where=str(index_path))


def write_prebuilt(index_dir: Path, index_path, corpus, encoder: str = "", **query) -> DenseRetriever:
    """Make index_dir an index over a prebuilt faiss file: docs/ from the corpus, settings.json pointing at it
    (written only after the dimension and size checks pass; when one fails, the index stage removes its temp dir)."""
    r = open_prebuilt(index_path, corpus, Path(index_dir) / "docs", encoder, **query)
    r.save(Path(index_dir))
    return r
