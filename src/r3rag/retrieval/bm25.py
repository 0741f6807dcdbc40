"""BM25 over a corpus with bm25s; the tokenizer settings are saved with the index.

Queries are always tokenised with the same settings as the corpus (FlashRAG's BM25 branch
stems the corpus but not the queries; saving the settings makes that impossible here).

Usage:
    r = BM25Retriever.build(docs, stopwords="en", stemmer=None)      # in memory (bm25s' own index)
    r.save(index_dir); r = BM25Retriever.load(index_dir)             # load: memory-mapped
    r = BM25Retriever.build_on_disk(store, index_dir)                # any size: chunked, bounded memory
    r.search(["Zentro Labs headquartered"], k=3)

An index directory holds `bm25/` (bm25s' files), `docs/` (a DocStore: documents are read by row
from a memory map, never loaded whole) and `settings.json`. Indexes saved before the DocStore
keep `docs.jsonl`, which `load` still reads.

Search does not go through bm25s' `retrieve` (without numba it scores with `np.add.at`, one query
at a time): the model's precomputed score matrix (vocab x docs, CSR) is multiplied by a sparse
query matrix, a chunk of queries at a time, and only the documents that match a query token are
ranked. The scores are the same float32 sums in the same order as bm25s' (a repeated query token
counts once per occurrence, unknown tokens are dropped); ties are broken by ascending document
index, so the result is deterministic.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Sequence
from pathlib import Path

from r3rag.core.protocol import Hit
from r3rag.retrieval.bm25_build import stemmer_of as _stemmer
from r3rag.retrieval.docstore import DocStore, link_store, open_docs, write_docstore
from r3rag.util.errors import UserError
from r3rag.util.nojax import block_jax

block_jax()  # before bm25s: it imports JAX when present, and forking after that deadlocks
import bm25s  # noqa: E402
import numpy as np  # noqa: E402
from scipy import sparse  # noqa: E402

CHUNK = 128  # queries per sparse product: bounds its size (at most CHUNK x num_docs entries)


def _settings(stopwords, stemmer, k1: float, b: float, method: str, num_docs: int) -> dict:
    """settings.json of a BM25 index, however it was built."""
    return {
        "backend": "bm25",
        "stopwords": stopwords,
        "stemmer": stemmer,
        "k1": k1,
        "b": b,
        "method": method,
        "lower": True,
        "num_docs": num_docs,
    }


def _tie_keys(cols: np.ndarray, seed: int) -> np.ndarray:
    """A per-query pseudo-random order of documents, to break score ties.

    Ties are common (short documents that share the query's words), and breaking them by
    document index would show the same few distractors for every query; bm25s' own order
    varies. A hash of (query, doc) keeps it varied and still deterministic."""
    x = (cols.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)) & np.uint64(0xFFFFFFFFFFFF)
    return x ^ (x >> np.uint64(17))


def _topk(scores: np.ndarray, cols: np.ndarray, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score, col) pairs, best first, ties in a per-query pseudo-random order;
    needs len(scores) >= k."""
    keys = _tie_keys(cols, seed)
    if len(scores) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        above, tied = np.flatnonzero(scores > kth), np.flatnonzero(scores == kth)
        need = k - len(above)
        if len(tied) > need:  # keep the tied entries with the smallest keys
            tied = tied[np.argpartition(keys[tied], need - 1)[:need]]
        keep = np.concatenate([above, tied])
        scores, cols, keys = scores[keep], cols[keep], keys[keep]
    order = np.lexsort((keys, -scores))
    return scores[order], cols[order]


class BM25Retriever:
    def __init__(self, model: bm25s.BM25, docs: Sequence[dict], settings: dict):
        self.model, self.docs, self.settings = model, docs, settings
        self._matrix = self._score_matrix(model)  # vocab x docs
        self.build_stats: dict = {}  # build_on_disk's: chunks, tokenized_chunks

    @staticmethod
    def _score_matrix(model: bm25s.BM25) -> sparse.csr_matrix:
        """bm25s' precomputed scores (its "csc" arrays: indptr over tokens) as a vocab x docs CSR."""
        sc = model.scores
        data, indices, indptr = sc["data"], sc["indices"], sc["indptr"]
        # One index dtype for both arrays, or scipy converts them on every product. indptr is the
        # small one (vocab + 1 entries): convert it and leave a memory-mapped `indices` mapped.
        idx = indices.dtype if indices.dtype in (np.int32, np.int64) else np.dtype(np.int64)
        if len(data) > np.iinfo(idx).max:
            idx = np.dtype(np.int64)
        return sparse.csr_matrix(
            (data, indices.astype(idx, copy=False), indptr.astype(idx, copy=False)),
            shape=(len(indptr) - 1, int(sc["num_docs"])),
            copy=False,
        )

    def _token_ids(self, tokens: list[str]) -> list[int]:
        # The vocab may hold "" (bm25s' empty token) past the matrix's last row: drop it too.
        vocab, n = self.model.vocab_dict, self._matrix.shape[0]
        return [i for i in (vocab.get(t) for t in tokens) if i is not None and i < n]

    def _scores(self, tokens: list[list[str]], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Top-k doc indices and scores per tokenised query (same scores as bm25s' `retrieve`)."""
        matrix = self._matrix
        num_docs = matrix.shape[1]
        dtype = matrix.dtype
        nonocc = self.model.nonoccurrence_array  # BM25L / BM25+: a constant added to every doc
        out_idx, out_scores = [], []
        for start in range(0, len(tokens), CHUNK):
            ids = [self._token_ids(t) for t in tokens[start : start + CHUNK]]
            lengths = np.fromiter((len(q) for q in ids), dtype=matrix.indptr.dtype, count=len(ids))
            q_indptr = np.zeros(len(ids) + 1, dtype=matrix.indptr.dtype)
            np.cumsum(lengths, out=q_indptr[1:])
            q_indices = np.fromiter((i for q in ids for i in q), dtype=matrix.indices.dtype, count=int(q_indptr[-1]))
            # Duplicates stay separate entries in query order: scipy then sums exactly as bm25s does.
            query = sparse.csr_matrix(
                (np.ones(len(q_indices), dtype=dtype), q_indices, q_indptr),
                shape=(len(ids), matrix.shape[0]),
                copy=False,
            )
            product = query @ matrix  # CSR, only the documents that match a query token
            p_data, p_cols, p_ptr = product.data, product.indices, product.indptr
            for r, q in enumerate(ids):
                seed = zlib.crc32(" ".join(tokens[start + r]).encode())
                vals, cols = p_data[p_ptr[r] : p_ptr[r + 1]], p_cols[p_ptr[r] : p_ptr[r + 1]]
                base = dtype.type(0)
                if nonocc is not None and q:  # as bm25s: scores += nonoccurrence_array[ids].sum()
                    extra = nonocc[np.asarray(q)].sum()
                    base = (np.zeros(1, dtype=dtype) + extra).astype(dtype)[0]
                    vals = (vals + extra).astype(dtype, copy=False)
                if len(vals) >= k:
                    top_s, top_i = _topk(vals, cols, k, seed)
                    if top_s[-1] > base:  # the unmatched documents (score `base`) cannot enter
                        out_idx.append(top_i)
                        out_scores.append(top_s)
                        continue
                if len(vals) == 0:  # every document scores `base`: the first k, by index
                    top_s, top_i = np.full(k, base, dtype=dtype), np.arange(k)
                else:  # fewer than k documents beat the unmatched ones: rank them all
                    dense = np.full(num_docs, base, dtype=dtype)
                    dense[cols] = vals
                    top_s, top_i = _topk(dense, np.arange(num_docs), k, seed)
                out_idx.append(top_i)
                out_scores.append(top_s)
        return out_idx, out_scores

    @classmethod
    def build(
        cls,
        docs: list[dict],
        stopwords: str | None = "en",
        stemmer: str | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
    ):
        settings = _settings(stopwords, stemmer, k1, b, method, len(docs))
        texts = [f"{d['title']} {d['text']}" for d in docs]
        tokens = bm25s.tokenize(texts, stopwords=stopwords, stemmer=_stemmer(stemmer), show_progress=False)
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index(tokens, show_progress=False)
        return cls(model, docs, settings)

    @classmethod
    def build_on_disk(
        cls,
        docs: Sequence[dict],
        index_dir: Path,
        stopwords: str | None = "en",
        stemmer: str | None = None,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        **chunking,
    ):
        """Index `docs` (a DocStore, ideally already at index_dir/docs, or a list) into the new
        `index_dir` in bounded memory (bm25_build), and load it memory-mapped. `chunking`:
        chunk_docs, bucket_entries, workers (tokenising processes; default one per core), work_dir
        (where finished chunks wait for a rerun after a kill; default index_dir/.bm25.work).
        `build_stats` of the result: {"chunks", "tokenized_chunks"} (the others were resumed)."""
        from r3rag.retrieval.bm25_build import METHODS, build_bm25_files, check_stopwords

        if method not in METHODS:  # checked before anything is written
            raise UserError(f"bm25 method {method!r}: expected one of {', '.join(METHODS)}")
        _stemmer(stemmer)  # PyStemmer missing: one clear line, before anything is written
        check_stopwords(stopwords)
        index_dir = Path(index_dir)
        _save_docs(docs, index_dir / "docs")
        stats = build_bm25_files(
            docs, index_dir / "bm25", stopwords=stopwords, stemmer=stemmer, k1=k1, b=b, method=method, **chunking
        )
        settings = _settings(stopwords, stemmer, k1, b, method, len(docs))
        (index_dir / "settings.json").write_text(json.dumps(settings, indent=2))
        r = cls.load(index_dir)
        r.build_stats = stats
        return r

    def save(self, index_dir: Path) -> None:
        index_dir.mkdir(parents=True, exist_ok=True)
        self.model.save(str(index_dir / "bm25"))
        _save_docs(self.docs, index_dir / "docs")
        (index_dir / "settings.json").write_text(json.dumps(self.settings, indent=2))

    @classmethod
    def load(cls, index_dir: Path, mmap: bool = True):
        settings = json.loads((index_dir / "settings.json").read_text())
        model = _load_model(index_dir / "bm25", mmap)
        docs = open_docs(index_dir)
        if len(docs) != int(model.scores["num_docs"]):
            raise UserError(
                f"{index_dir}: the index has {model.scores['num_docs']} documents but its document store {len(docs)}"
            )
        return cls(model, docs, settings)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.docs))
        tokens = bm25s.tokenize(
            list(queries),
            stopwords=self.settings["stopwords"],
            stemmer=_stemmer(self.settings["stemmer"]),
            return_ids=False,
            show_progress=False,
        )
        if k <= 0:
            return [[] for _ in queries]
        idx, scores = self._scores(tokens, k)
        out = []
        for row_idx, row_scores in zip(idx, scores):
            docs = [self.docs[i] for i in row_idx.tolist()]  # one lookup a hit (a DocStore decodes each)
            out.append([Hit(d["id"], float(s), d["title"], d["text"]) for d, s in zip(docs, row_scores.tolist())])
        return out


def _save_docs(docs: Sequence[dict], dest: Path) -> None:
    """`docs` as a DocStore at `dest`: kept when it is there, linked (or copied) when it is a store elsewhere."""
    if isinstance(docs, DocStore):
        if docs.path.resolve() != dest.resolve():
            shutil.rmtree(dest, ignore_errors=True)
            link_store(docs, dest)
        return
    write_docstore(dest, docs, source="docs")


def _load_model(folder: Path, mmap: bool) -> bm25s.BM25:
    """bm25s' files, checked: a missing or truncated file is one clear line, not numpy's traceback."""
    try:
        model = bm25s.BM25.load(str(folder), mmap=mmap)
    except (OSError, ValueError) as e:  # FileNotFoundError, a truncated .npy, malformed JSON
        raise UserError(f"{folder}: cannot load the BM25 index ({type(e).__name__}: {e}); rebuild it") from None
    sc = model.scores
    nnz, vocab_rows = int(sc["indptr"][-1]), len(sc["indptr"]) - 1
    if len(sc["data"]) != nnz or len(sc["indices"]) != nnz or len(model.vocab_dict) < vocab_rows:
        raise UserError(f"{folder}: the BM25 index files disagree in size (truncated?); rebuild it")
    return model
