"""Build a bm25s index in bounded memory: the corpus is tokenised in chunks, the index assembled on disk.

bm25s' own `BM25.index` holds every document's token ids as Python lists (tens of GB at 21M
passages). Here memory is bounded by the chunk and bucket sizes plus the vocabulary:

1. Tokenise: each chunk of `chunk_docs` documents goes through `bm25s.tokenize` (the very
   tokeniser queries use; in one spawned process per core, as it is pure Python and the build's
   bottleneck), its chunk-local token ids are mapped onto one shared vocabulary, and
   its (token, doc, term frequency) entries are written to the chunk's own files in the work
   directory, sorted by token, with the words it added to the vocabulary and its documents' lengths.
2. Score (r3rag.retrieval.bm25_score): idf and the average length are now known. The vocabulary is cut into buckets of about
   `bucket_entries` entries; for each bucket, every chunk's slice of it is read back, ordered by
   (token, doc), scored and appended to the output, so the CSC arrays are written front to back.

Resuming: a chunk's files are complete once its marker `c<i>.json` exists (written last, after the
data is synced); it records a hash of the chunk's documents. A killed build leaves its finished
chunks in the work directory (`work_dir`, default `.<out>.work` beside `out`), and a rerun keeps
every chunk whose marker, sizes and document hash still match (phase 1 is sequential, so that is a
prefix of the chunks: chunk i's token ids depend on the words chunks 0..i-1 added), tokenises the
rest and scores. A work directory made with other tokenising settings (stopwords, stemmer,
chunk_docs, bm25s version, corpus length) is emptied first; k1, b and method only enter phase 2, so
a rerun with other scoring settings reuses the chunks. The index is written inside the work
directory and renamed to `out` when complete (so `out` is never half-written; the two must be on
one file system), then the work directory is removed.

The files are bm25s' own format (`BM25.load(dir, mmap=True)` reads them), and the arrays equal
what `BM25.index` would produce, resumed or not: the scoring uses bm25s' own idf and tf functions
with the same float32/float64 types, entries are ordered the same way, and without a stemmer even
the vocabulary ids agree (first-seen order). tests/test_bm25_scale.py checks this.

Usage:
    build_bm25_files(store, out_dir / "bm25", stopwords="en", stemmer=None, k1=1.5, b=0.75, method="lucene")
    build_bm25_files(docs, out_dir / "bm25", chunk_docs=1000, workers=1)   # small chunks, in this process
    stats = build_bm25_files(store, out, work_dir=Path("runs/index/.work-x"))   # rerun after a kill: resumes
    stats  # {"chunks": 420, "tokenized_chunks": 17}: chunks this call tokenised (the rest were on disk)
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import orjson

from r3rag.util.nojax import block_jax

block_jax()  # before bm25s: it imports JAX when present, and forking after that deadlocks
import bm25s  # noqa: E402

from r3rag.retrieval.bm25_score import SCRATCH, score_all, write_vocab_and_params  # noqa: E402
from r3rag.retrieval.docstore import DocStore, rows_digest  # noqa: E402
from r3rag.util.errors import UserError  # noqa: E402

CHUNK_DOCS = 50_000  # ~25 MB of scratch entries and ~100-200 MB of Python token lists at 100 words a passage
BUCKET_ENTRIES = 4_000_000  # ~70 bytes an entry while a bucket is scored: ~300 MB
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
_DTYPES = {
    **dict(SCRATCH),
    "len": "<i4",
}  # a chunk's entries and its documents' lengths  # ... and its documents' lengths
FORMAT, VERSION = "r3rag-bm25-chunks", 1  # the work directory's layout
_META = "bm25-chunks.json"  # the work directory's settings: chunks made with others are not reused
_STAGING = "bm25-index.partial"  # the index being written, inside the work directory


class _Chunks:
    """Phase 1's output in the work directory: for chunk i, `c<i>.tok/.doc/.tf` (its entries, sorted by
    token), `c<i>.len` (its documents' lengths), `c<i>.words` (the words it added to the vocabulary, in
    id order) and, written last, the marker `c<i>.json`."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta
        self._prepare()

    def _prepare(self) -> None:
        """Keep the folder's chunks when they were made with the same settings; otherwise start afresh.
        Half-written files and a half-written index from a killed run go either way."""
        meta_path = self.folder / _META
        try:
            old = orjson.loads(meta_path.read_bytes())
        except (OSError, ValueError):
            old = None
        self.folder.mkdir(parents=True, exist_ok=True)
        if old != self.meta:
            self.drop_from(0)
            _write_synced(self.folder / f"{_META}.part", orjson.dumps(self.meta))
            os.replace(self.folder / f"{_META}.part", meta_path)
        for stale in self.folder.glob("*.part"):
            stale.unlink()
        shutil.rmtree(self.folder / _STAGING, ignore_errors=True)

    def remove(self) -> None:
        """Our files, and the folder if that empties it (a work_dir given by a caller may hold others)."""
        self.drop_from(0)
        (self.folder / _META).unlink(missing_ok=True)
        shutil.rmtree(self.folder / _STAGING, ignore_errors=True)
        try:
            self.folder.rmdir()
        except OSError:
            pass

    def path(self, i: int, ext: str) -> Path:
        return self.folder / f"c{i:05d}.{ext}"

    def write(self, i: int, rows: tuple[int, int], digest: str, entries, lengths, new_words: list[str]) -> None:
        """Chunk i's files, synced before its marker, so a marker never stands for data still in flight."""
        arrays = dict(zip(("tok", "doc", "tf"), entries), len=lengths)
        for ext, arr in arrays.items():
            _write_synced(self.path(i, ext), np.ascontiguousarray(arr, dtype=_DTYPES[ext]).tobytes())
        words = orjson.dumps(new_words)
        _write_synced(self.path(i, "words"), words)
        marker = {"rows": list(rows), "digest": digest, "entries": len(entries[0]), "words_bytes": len(words)}
        _write_synced(self.path(i, "json.part"), orjson.dumps(marker))
        os.replace(self.path(i, "json.part"), self.path(i, "json"))

    def valid(self, i: int, rows: tuple[int, int], digest: str) -> bool:
        """Chunk i finished for these rows of this corpus, its files of the sizes its marker says."""
        try:
            marker = orjson.loads(self.path(i, "json").read_bytes())
            sizes = {ext: self.path(i, ext).stat().st_size for ext in (*_DTYPES, "words")}
        except (OSError, ValueError):
            return False
        if not isinstance(marker, dict) or (marker.get("rows"), marker.get("digest")) != (list(rows), digest):
            return False
        want = {ext: 4 * marker.get("entries", -1) for ext, _ in SCRATCH}
        want.update(len=4 * (rows[1] - rows[0]), words=marker.get("words_bytes"))
        return sizes == want

    def drop_from(self, i: int) -> None:
        """Chunk i and every later one: they were built on a vocabulary that is about to change."""
        for p in self.folder.glob("c[0-9][0-9][0-9][0-9][0-9].*"):
            if int(p.name[1:6]) >= i:
                p.unlink(missing_ok=True)

    def read(self, i: int, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        dtype = np.dtype(_DTYPES[name])
        with open(self.path(i, name), "rb") as f:  # a plain read: no mapping lingers in the RSS
            f.seek(lo * dtype.itemsize)
            return np.fromfile(f, dtype=dtype, count=-1 if hi is None else hi - lo)

    def finished(self) -> int:
        return len(list(self.folder.glob("c[0-9][0-9][0-9][0-9][0-9].json")))

    def words(self, i: int) -> list[str]:
        return orjson.loads(self.path(i, "words").read_bytes())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def stemmer_of(name: str | None):
    """The PyStemmer stemmer a `stemmer` setting names (None: no stemming); queries use the same."""
    if not name:
        return None
    try:
        import Stemmer
    except ImportError:
        raise UserError("bm25 stemmer requires the PyStemmer package (pip install PyStemmer)") from None
    return Stemmer.Stemmer(name)  # bm25s.tokenize calls its stemWords on the unique tokens


def check_stopwords(stopwords) -> None:
    """An unknown stopword language is one clear line, before anything is written (bm25s' ValueError is one line)."""
    try:
        bm25s.tokenize([""], stopwords=stopwords, show_progress=False)
    except ValueError as e:
        raise UserError(f"bm25 stopwords {stopwords!r}: {e}") from None


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


def _entries(words: list[str], lengths: np.ndarray, flat: np.ndarray, vocab: dict):
    """A chunk's (token, local doc, tf) entries, sorted by (token, doc), its words mapped onto `vocab`;
    and the words it added to `vocab` (in id order: setdefault hands out ids as the words come)."""
    known = len(vocab)
    remap = np.fromiter((vocab.setdefault(w, len(vocab)) for w in words), dtype=np.int64, count=len(words))
    new_words = [w for w, r in zip(words, remap.tolist()) if r >= known]
    n = len(lengths)
    keys = remap[flat] * n + np.repeat(np.arange(n, dtype=np.int64), lengths)
    keys, counts = np.unique(keys, return_counts=True)  # one entry per (token, doc), in that order
    return (keys // n, keys % n, counts.astype(np.float32)), new_words


def _chunks(docs: Sequence[dict], ranges: list[tuple[int, int]], stopwords, stemmer: str | None, workers: int):
    """(first row, tokenised chunk) for each range, in order. With workers > 1, that many spawned processes
    tokenise (bm25s' tokeniser is pure Python: the build's bottleneck), at most 2 chunks each ahead, so
    memory stays bounded; a DocStore travels by path, a list as its chunk."""
    if workers <= 1 or len(ranges) < 2:
        for lo, hi in ranges:
            yield lo, _tokenize_rows(docs, lo, hi, stopwords, stemmer)
        return

    def submit(lo: int, hi: int):
        args = (docs, lo, hi) if isinstance(docs, DocStore) else (docs[lo:hi], 0, hi - lo)
        return lo, pool.submit(_tokenize_rows, *args, stopwords, stemmer)

    pool = ProcessPoolExecutor(
        min(workers, len(ranges)), mp_context=mp.get_context("spawn"), initializer=_exit_with, initargs=(os.getpid(),)
    )
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


def _exit_with(parent: int) -> None:
    """A tokenising worker's initializer: exit when the building process is gone. A SIGKILLed parent
    closes nothing the workers wait on (each holds both ends of the task queue's pipe), so without
    this they would wait forever, and keep the pipes of whoever started the build open."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _kept_chunks(docs: Sequence[dict], chunks: _Chunks, ranges: list[tuple[int, int]]) -> int:
    """How many leading chunks a previous run finished over these same documents (the rest are dropped)."""
    for i, (lo, hi) in enumerate(ranges):
        if not chunks.valid(i, (lo, hi), rows_digest(docs, lo, hi)):
            chunks.drop_from(i)
            return i
    return len(ranges)


def _add_df(df: np.ndarray, tok: np.ndarray, vocab_size: int) -> np.ndarray:
    """df plus one chunk's entries (one per (token, doc): a bincount of the tokens is the chunk's df)."""
    if vocab_size > len(df):
        df = np.concatenate([df, np.zeros(vocab_size - len(df), dtype=np.int64)])
    return df + np.bincount(tok, minlength=len(df))


def _tokenize_all(docs: Sequence[dict], chunks: _Chunks, stopwords, stemmer, chunk_docs: int, workers: int):
    """Phase 1, resuming after the chunks a previous run finished: returns (vocab, document frequencies,
    document lengths, chunks tokenised by this call, chunks in all)."""
    ranges = [(lo, min(lo + chunk_docs, len(docs))) for lo in range(0, len(docs), chunk_docs)]
    kept = _kept_chunks(docs, chunks, ranges)
    vocab: dict[str, int] = {}
    df = np.zeros(0, dtype=np.int64)
    lengths = []
    for i in range(kept):  # the finished chunks' state, from their files: no tokenising
        for w in chunks.words(i):
            vocab[w] = len(vocab)
        df = _add_df(df, chunks.read(i, "tok"), len(vocab))
        lengths.append(chunks.read(i, "len"))
    todo = ranges[kept:]
    for i, (lo, (words, lens, flat)) in enumerate(_chunks(docs, todo, stopwords, stemmer, workers), start=kept):
        (tok, doc, tf), new_words = _entries(words, lens, flat, vocab)
        del words, flat
        chunks.write(i, ranges[i], rows_digest(docs, *ranges[i]), (tok, doc + lo, tf), lens, new_words)
        df = _add_df(df, tok, len(vocab))
        lengths.append(lens.astype(np.int32))
    return vocab, df, np.concatenate(lengths), len(todo), len(ranges)


def build_bm25_files(
    docs: Sequence[dict],
    out: Path,
    stopwords: str | None = "en",
    stemmer=None,
    k1: float = 1.5,
    b: float = 0.75,
    method: str = "lucene",
    chunk_docs: int | None = None,
    bucket_entries: int = BUCKET_ENTRIES,
    workers: int | None = None,
    work_dir: Path | None = None,
) -> dict:
    """Write a bm25s index of `docs` (a list or a DocStore) into the new folder `out`; `stemmer` is a
    PyStemmer language name; `workers` tokenising processes (None: one per core); `chunk_docs` None:
    CHUNK_DOCS. Chunks a killed run finished in `work_dir` (default `.<out>.work` beside `out`) are
    reused. Returns {"chunks", "tokenized_chunks"}: chunks in all, and those this call tokenised."""
    if method not in METHODS:
        raise ValueError(f"bm25 method {method!r}: expected one of {', '.join(METHODS)}")
    if not len(docs):
        raise ValueError("no documents to index")
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists (the index is written into a new folder)")
    chunk_docs = chunk_docs or CHUNK_DOCS  # read here, not as the default: tests shrink it
    work = Path(work_dir) if work_dir else out.with_name(f".{out.name}.work")
    meta = {"format": FORMAT, "version": VERSION, "rows": len(docs), "chunk_docs": chunk_docs}
    meta.update(stopwords=stopwords, stemmer=stemmer, bm25s=bm25s.__version__)  # what the chunk files depend on
    chunks = _Chunks(work, meta)
    workers = (os.cpu_count() or 1) if workers is None else workers
    try:
        vocab, df, doc_len, tokenized, n_chunks = _tokenize_all(docs, chunks, stopwords, stemmer, chunk_docs, workers)
        staging = work / _STAGING
        staging.mkdir()
        score_all(chunks, staging, df, doc_len, {"k1": k1, "b": b, "method": method}, bucket_entries)
        write_vocab_and_params(staging, vocab, len(doc_len), k1, b, method)
    except BaseException:
        if not chunks.finished():  # nothing a rerun could resume from: leave no work folder behind
            chunks.remove()
        raise
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, out)  # complete or absent: nothing half-written is ever at `out`
    chunks.remove()  # as large as the index: not kept once it is published
    return {"chunks": n_chunks, "tokenized_chunks": tokenized}
