"""Build a bm25s index in bounded memory: the corpus is tokenised in chunks, the index assembled on disk.

bm25s' own `BM25.index` holds every document's token ids as Python lists (tens of GB at 21M
passages). Here memory is bounded by the chunk and bucket sizes plus the vocabulary:

1. Tokenise: each chunk of `chunk_docs` documents goes through `bm25s.tokenize` (the very
   tokeniser queries use; in one spawned process per core, as it is pure Python and the build's
   bottleneck), its chunk-local token ids are mapped onto one shared vocabulary, and
   its (token, doc, term frequency) entries are appended to scratch files sorted by token.
   Document frequencies and lengths are counted as it goes.
2. Score: idf and the average length are now known. The vocabulary is cut into buckets of about
   `bucket_entries` entries; for each bucket, every chunk's slice of it is read back, ordered by
   (token, doc), scored and appended to the output, so the CSC arrays are written front to back.

The files are bm25s' own format (`BM25.load(dir, mmap=True)` reads them), and the arrays equal
what `BM25.index` would produce: the scoring uses bm25s' own idf and tf functions with the same
float32/float64 types, entries are ordered the same way, and without a stemmer even the
vocabulary ids agree (first-seen order). tests/test_bm25_scale.py checks this.

Usage:
    build_bm25_files(store, out_dir / "bm25", stopwords="en", stemmer=None, k1=1.5, b=0.75, method="lucene")
    build_bm25_files(docs, out_dir / "bm25", chunk_docs=1000, workers=1)   # small chunks, in this process
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import shutil
import sys
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import orjson

sys.modules.setdefault("jax", None)  # bm25s imports JAX when present; forking after that deadlocks
import bm25s  # noqa: E402
from bm25s.scoring import _select_idf_scorer, _select_tfc_scorer  # noqa: E402 - its own formulas: bit-for-bit

from r3rag.errors import UserError  # noqa: E402
from r3rag.retrieval.docstore import DocStore  # noqa: E402

CHUNK_DOCS = 50_000  # ~25 MB of scratch entries and ~100-200 MB of Python token lists at 100 words a passage
BUCKET_ENTRIES = 4_000_000  # ~70 bytes an entry while a bucket is scored: ~300 MB
DELTA = 0.5  # bm25s' default delta (BM25L / BM25+)
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
_SCRATCH = (("tok", "<i4"), ("doc", "<i4"), ("tf", "<f4"))


class _Scratch:
    """Phase 1's output: three append-only arrays, and where each chunk's entries start."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True)
        self.files = {name: open(folder / name, "wb") for name, _ in _SCRATCH}
        self.starts = [0]

    def append(self, tok: np.ndarray, doc: np.ndarray, tf: np.ndarray) -> None:
        for name, arr in (("tok", tok), ("doc", doc), ("tf", tf)):
            self.files[name].write(np.ascontiguousarray(arr, dtype=dict(_SCRATCH)[name]).tobytes())
        self.starts.append(self.starts[-1] + len(tok))

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def read(self, name: str, lo: int, hi: int) -> np.ndarray:
        dtype = np.dtype(dict(_SCRATCH)[name])
        with open(self.folder / name, "rb") as f:  # a plain read: no mapping lingers in the RSS
            f.seek(lo * dtype.itemsize)
            return np.fromfile(f, dtype=dtype, count=hi - lo)


def stemmer_of(name: str | None):
    """The PyStemmer stemmer a `stemmer` setting names (None: no stemming); queries use the same."""
    if not name:
        return None
    try:
        import Stemmer
    except ImportError:
        raise UserError("bm25 stemmer requires the PyStemmer package (pip install PyStemmer)") from None
    return Stemmer.Stemmer(name)  # bm25s.tokenize calls its stemWords on the unique tokens


def _tokenize_rows(docs: Sequence[dict], lo: int, hi: int, stopwords, stemmer: str | None):
    """Rows lo..hi through bm25s.tokenize (in a worker process when there are several): the chunk's
    words in local-id order, each document's length, and the local token ids, flat."""
    texts = [f"{d['title']} {d['text']}" for d in docs[lo:hi]]
    tok = bm25s.tokenize(texts, stopwords=stopwords, stemmer=stemmer_of(stemmer), show_progress=False)
    words = [""] * len(tok.vocab)
    for w, i in tok.vocab.items():
        words[i] = w
    lengths = np.fromiter(map(len, tok.ids), dtype=np.int64, count=len(texts))
    flat = np.fromiter(itertools.chain.from_iterable(tok.ids), dtype=np.int32, count=int(lengths.sum()))
    return words, lengths, flat


def _entries(words: list[str], lengths: np.ndarray, flat: np.ndarray, vocab: dict) -> tuple[np.ndarray, ...]:
    """A chunk's (token, local doc, tf) entries, sorted by (token, doc), its words mapped onto `vocab`."""
    remap = np.fromiter((vocab.setdefault(w, len(vocab)) for w in words), dtype=np.int64, count=len(words))
    n = len(lengths)
    keys = remap[flat] * n + np.repeat(np.arange(n, dtype=np.int64), lengths)
    keys, counts = np.unique(keys, return_counts=True)  # one entry per (token, doc), in that order
    return keys // n, keys % n, counts.astype(np.float32)


def _chunks(docs: Sequence[dict], chunk_docs: int, stopwords, stemmer: str | None, workers: int):
    """(first row, tokenised chunk) in order. With workers > 1, that many spawned processes tokenise
    (bm25s' tokeniser is pure Python: the build's bottleneck), at most 2 chunks each ahead, so memory
    stays bounded; a DocStore travels by path, a list as its chunk."""
    ranges = [(lo, min(lo + chunk_docs, len(docs))) for lo in range(0, len(docs), chunk_docs)]
    if workers <= 1 or len(ranges) < 2:
        for lo, hi in ranges:
            yield lo, _tokenize_rows(docs, lo, hi, stopwords, stemmer)
        return

    def submit(lo: int, hi: int):
        args = (docs, lo, hi) if isinstance(docs, DocStore) else (docs[lo:hi], 0, hi - lo)
        return lo, pool.submit(_tokenize_rows, *args, stopwords, stemmer)

    pool = ProcessPoolExecutor(min(workers, len(ranges)), mp_context=mp.get_context("spawn"))
    try:
        todo = iter(ranges)
        pending = deque(submit(*r) for r in itertools.islice(todo, 2 * workers))
        while pending:
            lo, future = pending.popleft()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(submit(*nxt))
            yield lo, future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _tokenize_all(docs: Sequence[dict], scratch: _Scratch, stopwords, stemmer, chunk_docs: int, workers: int):
    """Phase 1: returns (vocab, document frequencies, document lengths)."""
    vocab: dict[str, int] = {}
    df = np.zeros(0, dtype=np.int64)
    lengths = []
    for lo, (words, lens, flat) in _chunks(docs, chunk_docs, stopwords, stemmer, workers):
        tok, doc, tf = _entries(words, lens, flat, vocab)
        del words, flat
        scratch.append(tok, doc + lo, tf)
        if len(vocab) > len(df):
            df = np.concatenate([df, np.zeros(len(vocab) - len(df), dtype=np.int64)])
        df += np.bincount(tok, minlength=len(df))
        lengths.append(lens.astype(np.int32))
    scratch.close()
    return vocab, df, np.concatenate(lengths)


def _buckets(df: np.ndarray, bucket_entries: int) -> np.ndarray:
    """Token-id boundaries of buckets of about `bucket_entries` entries (a bucket holds at least one token)."""
    ends = np.cumsum(df)
    bounds = [0]
    while bounds[-1] < len(df):
        done = ends[bounds[-1] - 1] if bounds[-1] else 0
        nxt = int(np.searchsorted(ends, done + bucket_entries, side="right"))
        bounds.append(max(nxt, bounds[-1] + 1))
    return np.asarray(bounds, dtype=np.int64)


class _NpyWriter:
    """A 1-D .npy file written front to back by plain writes (a memory map would count in the RSS)."""

    def __init__(self, path: Path, dtype, n: int):
        self.f = open(path, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (n,)}
        np.lib.format.write_array_header_1_0(self.f, header)
        self.dtype, self.left = np.dtype(dtype), n

    def write(self, arr: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(arr, dtype=self.dtype).tobytes())
        self.left -= len(arr)

    def close(self) -> None:
        self.f.close()
        if self.left:
            raise RuntimeError(f"{self.f.name}: {self.left} entries short")  # a bug, not bad input


def _idf_arrays(df: np.ndarray, n_docs: int, avg, params: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """idf per token, and BM25L/BM25+'s non-occurrence score, as bm25s' _build_idf_array and
    _build_nonoccurrence_array compute them (one scalar call a token, stored as float32) without
    their {token: df} dict, which costs ~100 bytes a vocabulary entry."""
    idf_fn = _select_idf_scorer(params["method"])
    idf = np.fromiter((idf_fn(d, N=n_docs) for d in df.tolist()), dtype=np.float64, count=len(df))
    if params["method"] not in ("bm25l", "bm25+"):
        return idf.astype(np.float32), None
    tfc = _select_tfc_scorer(params["method"])(0, avg, avg, params["k1"], params["b"], DELTA)
    return idf.astype(np.float32), (idf * tfc).astype(np.float32)


def _score_all(scratch: _Scratch, out: Path, df, doc_len, params: dict, bucket_entries: int) -> None:
    """Phase 2: the CSC arrays (token-major, docs ascending), scored bucket by bucket."""
    n_docs, method = len(doc_len), params["method"]
    avg = np.float64(int(doc_len.sum(dtype=np.int64))) / n_docs  # as bm25s: np.mean of the int lengths
    idf, nonocc = _idf_arrays(df, n_docs, avg, params)
    if nonocc is not None:
        np.save(out / "nonoccurrence_array.index.npy", nonocc)
    tfc = _select_tfc_scorer(method)
    bounds = _buckets(df, bucket_entries)
    # Where each bucket starts inside each chunk (chunk entries are sorted by token).
    cuts = [np.searchsorted(scratch.read("tok", a, b), bounds) + a for a, b in itertools.pairwise(scratch.starts)]
    nnz = int(df.sum())
    data = _NpyWriter(out / "data.csc.index.npy", np.float32, nnz)
    indices = _NpyWriter(out / "indices.csc.index.npy", np.int32, nnz)
    for j in range(len(bounds) - 1):
        parts = {name: [scratch.read(name, int(c[j]), int(c[j + 1])) for c in cuts] for name, _ in _SCRATCH}
        tok, doc, tf = (np.concatenate(parts[name]) for name, _ in _SCRATCH)
        del parts
        order = np.argsort(tok, kind="stable")  # chunks come in doc order: stable keeps docs ascending
        tok, doc, tf = tok[order], doc[order], tf[order]
        scores = idf[tok] * tfc(tf_array=tf, l_d=doc_len[doc], l_avg=avg, k1=params["k1"], b=params["b"], delta=DELTA)
        if nonocc is not None:
            scores -= nonocc[tok]
        data.write(scores.astype(np.float32))
        indices.write(doc)
    data.close()
    indices.close()
    indptr = np.zeros(len(df) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    np.save(out / "indptr.csc.index.npy", indptr)


def build_bm25_files(
    docs: Sequence[dict],
    out: Path,
    stopwords: str | None = "en",
    stemmer=None,
    k1: float = 1.5,
    b: float = 0.75,
    method: str = "lucene",
    chunk_docs: int = CHUNK_DOCS,
    bucket_entries: int = BUCKET_ENTRIES,
    workers: int | None = None,
) -> None:
    """Write a bm25s index of `docs` (a list or a DocStore) into the new folder `out`; `stemmer` is a
    PyStemmer language name; `workers` tokenising processes (None: one per core)."""
    if method not in METHODS:
        raise ValueError(f"bm25 method {method!r}: expected one of {', '.join(METHODS)}")
    if not len(docs):
        raise ValueError("no documents to index")
    out.mkdir(parents=True)
    scratch = _Scratch(out / ".scratch")
    try:
        workers = (os.cpu_count() or 1) if workers is None else workers
        vocab, df, doc_len = _tokenize_all(docs, scratch, stopwords, stemmer, chunk_docs, workers)
        params = {"k1": k1, "b": b, "method": method}
        _score_all(scratch, out, df, doc_len, params, bucket_entries)
    finally:
        shutil.rmtree(scratch.folder, ignore_errors=True)
    if "" not in vocab:  # as BM25.index(create_empty_token=True): "" past the last row of the matrix
        vocab[""] = len(vocab)
    (out / "vocab.index.json").write_bytes(orjson.dumps(vocab))
    params = {
        "k1": k1, "b": b, "delta": DELTA, "method": method, "idf_method": method, "dtype": "float32",
        "int_dtype": "int32", "num_docs": len(doc_len), "version": bm25s.__version__, "backend": "numpy",
    }  # fmt: skip
    (out / "params.index.json").write_text(json.dumps(params, indent=4))
