"""An on-disk, memory-mapped document store: rows of {"id", "title", "text"}, read by row in O(1) memory.

A corpus of any size (wiki-18: 21M passages, ~14 GB of JSONL) is imported by streaming, one line
at a time; nothing holds the corpus in Python objects. Reading row i touches only its own bytes,
so the retrieval server, its workers (which share the pages through the page cache), the env and
eval can all read from one store.

Layout of a store directory (all little-endian):
    docs.bin      each row's id, title and text as UTF-8, back to back
    offsets.i64   int64 field boundaries, 3 * rows + 1 of them: row i's id is
                  docs.bin[o[3i]:o[3i+1]], its title [o[3i+1]:o[3i+2]], its text [o[3i+2]:o[3i+3]]
    idhash.u64    the rows' id hashes (blake2b, 8 bytes), sorted; idrow.i64 the row of each
    meta.json     written last: {"format", "version", "rows", "bytes", "source"}

A store is built in a hidden sibling directory and renamed into place when complete, so a killed
import leaves no store (the next import removes what it left and starts over).
Duplicate ids are found after the stream by sorting the id hashes (16 bytes a row, not a set of
strings); the error names both lines, like every other JSONL input.

Usage:
    store = import_corpus("wiki-18.jsonl", "runs/.../docs")   # streaming; bad lines -> one clear UserError
    store = write_docstore("dir", docs)                        # from {"id", "title", "text"} dicts
    store = DocStore("dir")                                    # open: memory-mapped
    len(store); store[i]; store[10:20]; store.row_of("doc-id"); for doc in store: ...
    rows_digest(store, 0, 50_000)                              # a row range's hash (a list of the same docs: equal)
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from r3rag.util.errors import UserError

FORMAT, VERSION = "r3rag-docstore", 1
FILES = ("docs.bin", "offsets.i64", "idhash.u64", "idrow.i64", "meta.json")  # a store's files, meta.json last
_BUFFER_ROWS = 65536  # offsets and hashes are flushed to disk every this many rows


def _id_hash(doc_id: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id, digest_size=8).digest(), "little")


def _map(path: Path, dtype) -> np.ndarray:
    """A read-only memory map of a raw array file (an empty file gives an empty array: mmap refuses size 0).
    A plain ndarray over the map, not np.memmap, whose per-slice bookkeeping doubles a row lookup's cost."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=dtype)


class DocStore(Sequence):
    """A read-only sequence of {"id", "title", "text"} dicts over a store directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise UserError(f"{self.path}: not a document store (no meta.json: missing, or its import did not finish)")
        try:
            self.meta = json.loads(meta_path.read_text())
        except ValueError:
            self.meta = {}
        if not isinstance(self.meta, dict) or (self.meta.get("format"), self.meta.get("version")) != (FORMAT, VERSION):
            raise UserError(f"{meta_path}: not an {FORMAT} version {VERSION} store; re-import the corpus")
        self._check_sizes()
        self._offsets = _map(self.path / "offsets.i64", "<i8")
        self._hashes = _map(self.path / "idhash.u64", "<u8")
        self._rows = _map(self.path / "idrow.i64", "<i8")
        with open(self.path / "docs.bin", "rb") as f:
            self._bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.meta["bytes"] else b""

    def _check_sizes(self) -> None:
        """A truncated or swapped file is one clear line, not a garbled document later."""
        rows, size = self.meta["rows"], self.meta["bytes"]
        want = {"docs.bin": size, "offsets.i64": 8 * (3 * rows + 1), "idhash.u64": 8 * rows, "idrow.i64": 8 * rows}
        for name, n in want.items():
            p = self.path / name
            have = p.stat().st_size if p.is_file() else None
            if have != n:
                what = "missing" if have is None else f"{have} bytes, expected {n}"
                raise UserError(f"{p}: document store file is {what} (truncated or from another store); re-import")

    def __reduce__(self):  # pickled (e.g. to a spawned worker) by path: the child maps the same files
        return (DocStore, (self.path,))

    def __len__(self) -> int:
        return self.meta["rows"]

    def _field(self, j: int) -> str:
        a, b = self._offsets[j : j + 2].tolist()
        return self._bytes[a:b].decode("utf-8")

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"row {i} out of range for a store of {n} rows")
        i %= n
        a, b, c, d = self._offsets[3 * i : 3 * i + 4].tolist()
        data = self._bytes
        return {"id": data[a:b].decode("utf-8"), "title": data[b:c].decode("utf-8"), "text": data[c:d].decode("utf-8")}

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other) -> bool:  # equal to any sequence of the same docs (a list of dicts included)
        if not isinstance(other, Sequence) or isinstance(other, str | bytes) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other))

    __hash__ = None

    def doc_id(self, i: int) -> str:
        return self._field(3 * int(i))

    def row_of(self, doc_id: str) -> int | None:
        """The row holding `doc_id`, or None: a binary search of the sorted id hashes (O(log n) pages)."""
        h = np.uint64(_id_hash(str(doc_id).encode()))
        lo = int(np.searchsorted(self._hashes, h, side="left"))
        while lo < len(self._hashes) and self._hashes[lo] == h:  # a hash collision: compare the ids
            row = int(self._rows[lo])
            if self.doc_id(row) == doc_id:
                return row
            lo += 1
        return None

    def digest(self, lo: int, hi: int) -> str:
        """A hash of rows lo..hi as stored (no decoding): what a resumable build checks a range against."""
        o = np.asarray(self._offsets[3 * lo : 3 * hi + 1], dtype="<i8")
        return _digest(o - o[0], self._bytes[int(o[0]) : int(o[-1])])

    def close(self) -> None:
        if isinstance(self._bytes, mmap.mmap):
            self._bytes.close()


def rows_digest(docs: Sequence[dict], lo: int, hi: int) -> str:
    """A hash of rows lo..hi's ids, titles and texts (with their boundaries, so no two splits of the same
    bytes agree); the same for a DocStore and a list of the same documents."""
    if isinstance(docs, DocStore):
        return docs.digest(lo, hi)
    fields = [f.encode() for d in docs[lo:hi] for f in (d["id"], d["title"], d["text"])]
    offsets = np.zeros(len(fields) + 1, dtype="<i8")
    np.cumsum([len(f) for f in fields], out=offsets[1:])
    return _digest(offsets, b"".join(fields))


def _digest(offsets: np.ndarray, data) -> str:
    h = hashlib.blake2b(offsets.tobytes(), digest_size=16)
    h.update(data)
    return h.hexdigest()


class _Writer:
    """Appends rows to a store being built in `tmp`; `finish` checks ids, writes meta.json last, renames."""

    def __init__(self, dest: Path, source: str):
        self.dest, self.source = dest, source
        self.tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
        _remove_stale_partials(dest)
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        self.docs = open(self.tmp / "docs.bin", "wb")
        self.offsets = open(self.tmp / "offsets.i64", "wb")
        self.pos, self.rows = 0, 0
        self.hashes: list[np.ndarray] = []
        self._buf_off: list[int] = [0]
        self._buf_hash: list[int] = []

    def add(self, doc: dict) -> None:
        doc_id = doc["id"].encode()
        for field in (doc_id, doc["title"].encode(), doc["text"].encode()):
            self.docs.write(field)
            self.pos += len(field)
            self._buf_off.append(self.pos)
        self._buf_hash.append(_id_hash(doc_id))
        self.rows += 1
        if len(self._buf_hash) >= _BUFFER_ROWS:
            self._flush()

    def _flush(self) -> None:
        self.offsets.write(np.asarray(self._buf_off, dtype="<i8").tobytes())
        self.hashes.append(np.asarray(self._buf_hash, dtype="<u8"))
        self._buf_off, self._buf_hash = [], []

    def finish(self, line_of) -> DocStore:
        """`line_of(rows)` -> "file:line" for each row (only called to name duplicates)."""
        self._flush()
        self.docs.close()
        self.offsets.close()
        hashes = np.concatenate(self.hashes) if self.hashes else np.zeros(0, dtype="<u8")
        self.hashes = []
        order = np.argsort(hashes, kind="stable")  # equal hashes keep row order: the first row comes first
        hashes = hashes[order]
        _check_duplicates(self.tmp, hashes, order, line_of)
        hashes.tofile(self.tmp / "idhash.u64")
        order.astype("<i8").tofile(self.tmp / "idrow.i64")
        # the source's file name, not its path: the same corpus gives the same store wherever it lies
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "rows": self.rows,
            "bytes": self.pos,
            "source": Path(self.source).name,
        }
        if Path(self.source).is_file():
            meta["source_bytes"] = Path(self.source).stat().st_size  # with the name: is a store this file's import
        (self.tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if self.dest.exists():
            shutil.rmtree(self.dest)
        os.replace(self.tmp, self.dest)
        return DocStore(self.dest)

    def abort(self) -> None:
        for f in (self.docs, self.offsets):
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _check_duplicates(tmp: Path, hashes: np.ndarray, order: np.ndarray, line_of) -> None:
    """Raise for the duplicate id whose second occurrence comes first in the file, as a streaming check would."""
    same = np.flatnonzero(hashes[1:] == hashes[:-1])
    if not len(same):
        return
    offsets = _map(tmp / "offsets.i64", "<i8")
    with open(tmp / "docs.bin", "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""

    def doc_id(row: int) -> bytes:
        return data[int(offsets[3 * row]) : int(offsets[3 * row + 1])]

    found = []  # (second row, first row) of each real duplicate (equal hashes may be a collision)
    for j in same.tolist():
        first = j
        while first > 0 and hashes[first - 1] == hashes[j]:
            first -= 1
        for a in range(first, j + 1):
            if doc_id(int(order[a])) == doc_id(int(order[j + 1])):
                found.append((int(order[j + 1]), int(order[a])))
                break
    if found:
        second, first = min(found)
        where_second, where_first = line_of([second, first])
        raise UserError(
            f"{where_second}: duplicate id {doc_id(second).decode()!r} (first on line {where_first.rsplit(':', 1)[-1]})"
        )


def _remove_stale_partials(dest: Path) -> None:
    """Partial stores that killed imports left beside `dest` (their process is gone)."""
    for d in dest.parent.glob(f".{dest.name}.partial-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _build(dest: str | Path, rows: Iterable[tuple[str, dict]], source: str, line_of) -> DocStore:
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    writer = _Writer(dest, source)
    try:
        for _, doc in rows:  # `where` is only needed again to name a duplicate: see line_of
            writer.add(doc)
        if writer.rows == 0:
            raise UserError(f"{source}: corpus is empty")
        return writer.finish(line_of)
    except BaseException:
        writer.abort()
        raise


def import_corpus(src: str | Path, dest: str | Path) -> DocStore:
    """Stream a FlashRAG / Search-R1 JSONL corpus (or {id, title, text} rows) into a store at `dest`."""
    from r3rag.data.corpus import iter_corpus

    src = Path(src)

    def line_of(rows: list[int]) -> list[str]:
        want, out = set(rows), {}
        for row, (where, _) in enumerate(iter_corpus(src)):  # a second pass, only on the error path
            if row in want:
                out[row] = where
                if len(out) == len(want):
                    break
        return [out[r] for r in rows]

    return _build(dest, iter_corpus(src), str(src), line_of)


def write_docstore(dest: str | Path, docs: Iterable[dict], source: str = "docs") -> DocStore:
    """A store from {"id", "title", "text"} dicts (ids are strings); a repeated id names both rows."""
    rows = ((f"{source}:{i + 1}", d) for i, d in enumerate(docs))
    return _build(dest, rows, source, lambda rows: [f"{source}:{r + 1}" for r in rows])


def link_store(store: DocStore, dest: Path) -> DocStore:
    """`store`'s files at `dest` too: hard links where the file system allows (a store is never
    changed in place, and 21M passages are 14 GB), else copies; meta.json last, so a store
    cut short is never taken for a complete one."""
    dest.mkdir(parents=True)
    for name in FILES:
        try:
            os.link(store.path / name, dest / name)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(store.path / name, dest / name)
    return DocStore(dest)


def open_docs(index_dir: Path, name: str = "docs"):
    """The documents saved beside an index: a store `name/`, or (older indexes) `name.jsonl` as a list."""
    if (index_dir / name).is_dir():
        return DocStore(index_dir / name)
    from r3rag.util.jsonl import read_jsonl

    return read_jsonl(index_dir / f"{name}.jsonl")
