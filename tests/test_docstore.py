"""The on-disk DocStore: a streaming import of FlashRAG / Search-R1 corpora read back by row and by
id, bad lines as one clear error naming file and line, damaged stores refused, and an import
killed midway leaves nothing behind and the next one starts clean."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from r3rag.data.corpus import load_corpus
from r3rag.retrieval.docstore import DocStore, import_corpus, write_docstore
from r3rag.util.errors import UserError

ROWS = [
    {"id": 0, "contents": '"Evan Morris"\nEvan Morris was a lobbyist.'},
    {"id": "b", "title": "Théo", "text": "Unicode — survives: 東京."},
    {"id": "c", "contents": "no title line at all"},
    {"id": "d", "title": "", "text": ""},
]


def _write(path: Path, rows, extra: str = "") -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + extra, encoding="utf-8")
    return path


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_import_reads_back_every_row_as_load_corpus_does(tmp_path):
    src = _write(tmp_path / "c.jsonl", ROWS, extra="\n")  # a trailing blank line is skipped
    store = import_corpus(src, tmp_path / "docs")
    want = load_corpus(src)
    assert len(store) == 4 and store == want and list(store) == want
    assert store[0] == {"id": "0", "title": "Evan Morris", "text": "Evan Morris was a lobbyist."}
    assert store[-1] == want[-1] and store[1:3] == want[1:3]
    assert [store.row_of(d["id"]) for d in want] == [0, 1, 2, 3] and store.row_of("nope") is None
    with pytest.raises(IndexError):
        store[4]
    again = pickle.loads(pickle.dumps(store))  # by path: a spawned server worker maps the same files
    assert again.path == store.path and again[1] == want[1]
    assert _left(tmp_path) == ["c.jsonl", "docs"]  # no partial directory beside it


def test_lookups_come_from_a_memory_map(tmp_path):
    docs = [{"id": f"d{i}", "title": f"T{i}", "text": "word " * (i % 50)} for i in range(5000)]
    store = write_docstore(tmp_path / "docs", docs)
    assert type(store._offsets.base.obj).__name__ == "mmap" and type(store._bytes).__name__ == "mmap"
    assert store[4321] == docs[4321] and store.row_of("d4999") == 4999
    # the id index: sorted hashes, a permutation of the rows
    assert sorted(store._rows.tolist()) == list(range(5000))


@pytest.mark.parametrize(
    "lines, needles",
    [
        (
            [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"}],
            [":3:", "duplicate id 'a'", "line 1"],
        ),
        ([{"id": "a", "text": "x"}, {"title": "no id", "text": "y"}], [":2:", "'id'"]),
        ([{"id": "a", "text": "x"}, {"id": "b", "title": "no text"}], [":2:", "'contents'"]),
        ([{"id": "a", "text": "x"}, {"id": "b", "contents": 7}], [":2:", "'contents' must be a string"]),
        ([{"id": "a", "text": "x"}, '{"id": "b", "text": '], [":2:", "malformed JSON"]),
        ([{"id": "a", "text": "x"}, "[1, 2]"], [":2:", "expected a JSON object"]),
        ([], ["corpus is empty"]),
    ],
)
def test_bad_corpus_is_one_line_naming_file_and_line(tmp_path, lines, needles):
    src = tmp_path / "bad.jsonl"
    src.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    with pytest.raises(UserError) as e:
        import_corpus(src, tmp_path / "docs")
    msg = str(e.value)
    assert "\n" not in msg and (str(src) in msg or "empty" in msg), msg
    for n in needles:
        assert n in msg, msg
    assert _left(tmp_path) == ["bad.jsonl"]  # nothing half-written


def test_non_utf8_and_missing_file(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(UserError, match=r"c\.jsonl:2: not valid UTF-8"):
        import_corpus(src, tmp_path / "docs")
    with pytest.raises(UserError, match="not found"):
        import_corpus(tmp_path / "missing.jsonl", tmp_path / "docs")


def test_duplicates_from_a_list_name_both_rows(tmp_path):
    with pytest.raises(UserError, match=r"docs:3: duplicate id 'x' \(first on line 1\)"):
        write_docstore(tmp_path / "s", [{"id": "x", "title": "", "text": "1"}, {"id": "y", "title": "", "text": ""},
                                        {"id": "x", "title": "", "text": "2"}])  # fmt: skip
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("victim", ["docs.bin", "offsets.i64", "idrow.i64", "meta.json"])
def test_damaged_store_is_refused(tmp_path, victim):
    store = write_docstore(tmp_path / "s", [{"id": str(i), "title": "t", "text": "x" * i} for i in range(100)])
    store.close()
    path = tmp_path / "s" / victim
    if victim == "meta.json":
        path.unlink()
        needle = "no meta.json"
    else:
        path.write_bytes(path.read_bytes()[:-5])
        needle = f"{victim}: document store file is"
    with pytest.raises(UserError, match=needle):
        DocStore(tmp_path / "s")


_SLOW_IMPORT = """
import sys, time
import r3rag.retrieval.docstore as ds
real = ds._Writer.add
def slow(self, doc):
    real(self, doc)
    if self.rows % 500 == 0:
        self._flush(); self.docs.flush(); self.offsets.flush(); time.sleep(0.05)
ds._Writer.add = slow
ds.import_corpus(sys.argv[1], sys.argv[2])
"""


def test_killed_import_leaves_no_store_and_the_next_one_is_clean(tmp_path):
    src = _write(tmp_path / "c.jsonl", [{"id": str(i), "title": f"T{i}", "text": f"text {i}"} for i in range(20_000)])
    dest = tmp_path / "out" / "docs"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_IMPORT, str(src), str(dest)])
    deadline = time.monotonic() + 60
    while not any((tmp_path / "out").glob(".docs.partial-*/docs.bin")):
        assert proc.poll() is None and time.monotonic() < deadline, "the import finished or never started"
        time.sleep(0.01)
    time.sleep(0.3)  # let it write some rows
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = list((tmp_path / "out").glob(".docs.partial-*"))
    assert not dest.exists() and len(partial) == 1 and (partial[0] / "docs.bin").stat().st_size > 0
    with pytest.raises(UserError, match="not a document store"):
        DocStore(partial[0])  # what a killed import leaves is never mistaken for a store
    store = import_corpus(src, dest)  # the rerun removes the dead run's partial directory
    assert len(store) == 20_000 and store[19_999]["text"] == "text 19999"
    assert _left(tmp_path / "out") == ["docs"]
