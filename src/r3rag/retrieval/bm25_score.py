"""Phase 2 of the bounded-memory BM25 build (r3rag.retrieval.bm25_build): score the tokenised
chunks into bm25s' CSC files, bucket by bucket, and write its vocabulary and parameters.

idf and the average document length are known once every chunk is tokenised. The vocabulary is cut
into buckets of about `bucket_entries` entries; for each bucket, every chunk's slice of it is read
back, ordered by (token, doc), scored with bm25s' own idf and tf functions (same float types: the
arrays equal what `BM25.index` writes) and appended, so the arrays are written front to back and
memory stays at one bucket's entries.

Usage (from bm25_build, `chunks` its work directory of phase-1 files):
    score_all(chunks, staging, df, doc_len, {"k1": 1.5, "b": 0.75, "method": "lucene"}, bucket_entries)
    write_vocab_and_params(staging, vocab, n_docs, 1.5, 0.75, "lucene")
"""

from __future__ import annotations

import json
from pathlib import Path

import bm25s
import numpy as np
import orjson
from bm25s.scoring import _select_idf_scorer, _select_tfc_scorer  # its own formulas: bit-for-bit

DELTA = 0.5  # bm25s' default delta (BM25L / BM25+)
SCRATCH = (("tok", "<i4"), ("doc", "<i4"), ("tf", "<f4"))  # a chunk's entries, as phase 1 writes them


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


def score_all(chunks, out: Path, df, doc_len, params: dict, bucket_entries: int) -> None:
    """The CSC arrays (token-major, docs ascending) into `out`, scored bucket by bucket; `chunks` reads
    phase 1's entries back (bm25_build._Chunks)."""
    n_docs, method = len(doc_len), params["method"]
    avg = np.float64(int(doc_len.sum(dtype=np.int64))) / n_docs  # as bm25s: np.mean of the int lengths
    idf, nonocc = _idf_arrays(df, n_docs, avg, params)
    if nonocc is not None:
        np.save(out / "nonoccurrence_array.index.npy", nonocc)
    tfc = _select_tfc_scorer(method)
    bounds = _buckets(df, bucket_entries)
    # Where each bucket starts inside each chunk (chunk entries are sorted by token).
    n_chunks = -(-len(doc_len) // int(chunks.meta["chunk_docs"]))
    cuts = [np.searchsorted(chunks.read(i, "tok"), bounds) for i in range(n_chunks)]
    nnz = int(df.sum())
    data = _NpyWriter(out / "data.csc.index.npy", np.float32, nnz)
    indices = _NpyWriter(out / "indices.csc.index.npy", np.int32, nnz)
    for j in range(len(bounds) - 1):
        parts = {
            name: [chunks.read(i, name, int(c[j]), int(c[j + 1])) for i, c in enumerate(cuts)] for name, _ in SCRATCH
        }
        tok, doc, tf = (np.concatenate(parts[name]) for name, _ in SCRATCH)
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


def write_vocab_and_params(folder: Path, vocab: dict, n_docs: int, k1: float, b: float, method: str) -> None:
    if "" not in vocab:  # as BM25.index(create_empty_token=True): "" past the last row of the matrix
        vocab[""] = len(vocab)
    (folder / "vocab.index.json").write_bytes(orjson.dumps(vocab))
    params = {
        "k1": k1, "b": b, "delta": DELTA, "method": method, "idf_method": method, "dtype": "float32",
        "int_dtype": "int32", "num_docs": n_docs, "version": bm25s.__version__, "backend": "numpy",
    }  # fmt: skip
    (folder / "params.index.json").write_text(json.dumps(params, indent=4))
