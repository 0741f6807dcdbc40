"""BM25 at scale: the chunked on-disk build equals bm25s' own index (arrays and search results),
it serves memory-mapped, damaged or mismatched index files are one clear error, and a build (or an
index stage) killed in the middle publishes nothing and resumes from its finished chunks, giving
the same files bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import r3rag.retrieval.bm25_build as bb
from r3rag.core.artifacts import list_artifacts
from r3rag.experiments.pipeline import run_stage
from r3rag.retrieval import load_retriever
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.retrieval.docstore import DocStore, rows_digest, write_docstore
from r3rag.util.errors import UserError

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


def _corpus(n: int = 600) -> list[dict]:
    """Documents with shared, rare, repeated and missing words (and two with no tokens at all)."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(400)]
    docs = []
    for i in range(n):
        k = int(rng.integers(0, 40))
        text = " ".join(words[int(j)] for j in rng.zipf(1.3, k) % len(words))
        docs.append({"id": f"d{i}", "title": f"Title {i % 37}", "text": text})
    docs[5] = {"id": "d5", "title": "", "text": "the and of"}  # stopwords only: no tokens
    docs[9] = {"id": "d9", "title": "", "text": ""}
    return docs


def _on_disk(docs, folder, workers=1, **kw):
    # tiny chunks and buckets: many chunks, many buckets, tokens split across both
    return BM25Retriever.build_on_disk(docs, folder, chunk_docs=37, bucket_entries=500, workers=workers, **kw)


@pytest.mark.parametrize("method", METHODS)
def test_chunked_build_equals_bm25s_index(tmp_path, method):
    docs = _corpus()
    ref = BM25Retriever.build(docs, method=method).model
    got = _on_disk(docs, tmp_path / "idx", method=method).model
    for key in ("data", "indices", "indptr"):
        a, b = ref.scores[key], got.scores[key]
        assert a.dtype == b.dtype and np.array_equal(a, b), key  # bit for bit
    assert got.vocab_dict == ref.vocab_dict  # no stemmer: the same first-seen token ids
    if method in ("bm25l", "bm25+"):
        assert np.array_equal(got.nonoccurrence_array, ref.nonoccurrence_array)
    params = json.loads((tmp_path / "idx/bm25/params.index.json").read_text())
    assert params["num_docs"] == len(docs) and params["method"] == method


def test_tokenising_in_worker_processes_gives_the_same_files(tmp_path):
    """Chunks tokenised by 2 spawned processes (from a DocStore, and from a list) = in this process."""
    docs = _corpus(400)
    store = write_docstore(tmp_path / "docs", docs)
    one = _on_disk(docs, tmp_path / "one")
    for name, source in (("store", store), ("list", docs)):
        two = _on_disk(source, tmp_path / name, workers=2)
        for key in ("data", "indices", "indptr"):
            assert np.array_equal(one.model.scores[key], two.model.scores[key]), (name, key)
        assert two.model.vocab_dict == one.model.vocab_dict


def test_same_hits_as_in_memory_on_real_text(tmp_path, hotpotqa_pool):
    real_docs, questions = hotpotqa_pool
    queries = [q["question"] for q in questions[:200]] + ["", "zzzz unknownword"]
    mem = BM25Retriever.build(real_docs)
    disk = BM25Retriever.build_on_disk(real_docs, tmp_path / "idx", chunk_docs=500, bucket_entries=20_000, workers=1)
    a, b = mem.search(queries, 10), disk.search(queries, 10)
    assert [[(h.doc_id, h.score, h.title, h.text) for h in r] for r in a] == [
        [(h.doc_id, h.score, h.title, h.text) for h in r] for r in b
    ]


def test_loaded_index_is_memory_mapped(tmp_path):
    docs = _corpus(200)
    _on_disk(docs, tmp_path / "idx")
    r = load_retriever(tmp_path / "idx")
    assert isinstance(r.model.scores["data"], np.memmap) and isinstance(r.model.scores["indices"], np.memmap)
    assert isinstance(r.docs, DocStore) and r.docs == docs
    assert r.search(["w1 w2"], 3)[0][0].doc_id in {d["id"] for d in docs}


def test_save_writes_a_docstore_and_old_docs_jsonl_still_loads(tmp_path):
    docs = _corpus(50)
    r = BM25Retriever.build(docs)
    r.save(tmp_path / "new")
    assert (tmp_path / "new/docs/meta.json").is_file() and not (tmp_path / "new/docs.jsonl").exists()
    old = tmp_path / "old"  # an index saved before the DocStore: docs.jsonl beside bm25/
    shutil.copytree(tmp_path / "new", old)
    shutil.rmtree(old / "docs")
    (old / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    for folder in (tmp_path / "new", old):
        assert load_retriever(folder).search(["w3"], 5) == r.search(["w3"], 5)


def test_bad_index_files_are_one_clear_error(tmp_path):
    docs = _corpus(100)
    _on_disk(docs, tmp_path / "idx")
    data = tmp_path / "idx/bm25/data.csc.index.npy"
    intact = data.read_bytes()
    data.write_bytes(intact[:-8])  # truncated
    with pytest.raises(UserError, match="cannot load the BM25 index|disagree in size") as e:
        load_retriever(tmp_path / "idx")
    assert "\n" not in str(e.value)
    data.write_bytes(intact)
    shutil.rmtree(tmp_path / "idx/docs")  # a corpus of another length beside the index
    write_docstore(tmp_path / "idx/docs", docs[:99])
    with pytest.raises(UserError, match="index has 100 documents but its document store 99"):
        load_retriever(tmp_path / "idx")


def test_unknown_method_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="bm25 method 'okapi'"):
        BM25Retriever.build_on_disk(_corpus(10), tmp_path / "idx", method="okapi")
    assert not (tmp_path / "idx").exists()


def test_index_stage_interrupted_mid_build_publishes_nothing_and_resumes(tmp_path, monkeypatch):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in _corpus(300)))
    runs = tmp_path / "runs"
    sets = [f"corpus={corpus}", "world="]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as Ctrl-C between the two phases

    monkeypatch.setattr(bb, "score_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_stage("index", None, sets, runs)
    assert list_artifacts(runs, "index") == []  # nothing published; the tokenised chunk waits for the rerun
    assert [p.name for p in (runs / "index").iterdir()] == [next((runs / "index").glob(".work-*")).name]
    monkeypatch.undo()
    ref = run_stage("index", None, sets, runs)
    m = ref.manifest["metrics"]
    assert (m["docs"], m["chunks"], m["tokenized_chunks"]) == (300, 1, 0)  # resumed: nothing tokenised again
    assert [p.name for p in (runs / "index").iterdir()] == [ref.id]  # the work folder went with the publish
    r = load_retriever(ref.path / "index")
    assert isinstance(r.docs, DocStore) and len(r.docs) == 300


# --- resuming a killed build --------------------------------------------------------------------------

KILLED_BUILD = r"""
import os, signal, sys
from pathlib import Path
import r3rag.retrieval.bm25_build as bb
from tests.test_bm25_scale import _corpus

out, work = Path(sys.argv[1]), Path(sys.argv[2])
real_write = bb._Chunks.write

def write_then_die(self, i, *args):
    real_write(self, i, *args)
    if i == 1:  # chunks 0 and 1 are finished, marker and all
        os.kill(os.getpid(), signal.SIGKILL)

bb._Chunks.write = write_then_die
bb.build_bm25_files(_corpus(), out, chunk_docs=37, bucket_entries=500, workers=1, work_dir=work)
print("not killed")
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _counting_tokenizer(monkeypatch) -> list[int]:
    """The first row of every chunk this process tokenises (workers=1: in this process)."""
    firsts, real = [], bb._tokenize_rows

    def counting(docs, lo, hi, *args):
        firsts.append(lo)
        return real(docs, lo, hi, *args)

    monkeypatch.setattr(bb, "_tokenize_rows", counting)
    return firsts


def test_killed_build_resumes_without_redoing_chunks(tmp_path, monkeypatch):
    """SIGKILL after 2 of 17 chunks: nothing at `out`; the rerun tokenises chunks 2..16 only, and the
    index equals an uninterrupted build's, file for file, bit for bit."""
    out, work, root = tmp_path / "bm25", tmp_path / "work", Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_BUILD, str(out), str(work)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=300,  # orphaned tokenising workers holding the pipes would hang it (bm25_build._exit_with)
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert not out.exists()  # nothing half-written is visible
    assert sorted(p.name for p in work.glob("c*.json")) == ["c00000.json", "c00001.json"]
    (work / "c00002.tok").write_bytes(b"half a chunk")  # as if killed mid-write, before its marker
    kept = {p.name: p.stat().st_mtime_ns for p in work.glob("c0000[01].*")}

    firsts = _counting_tokenizer(monkeypatch)
    real_score = bb.score_all

    def score_and_check(*args):  # the kept chunks' files, untouched when phase 2 reads them
        assert {p.name: p.stat().st_mtime_ns for p in work.glob("c0000[01].*")} == kept
        return real_score(*args)

    monkeypatch.setattr(bb, "score_all", score_and_check)
    stats = bb.build_bm25_files(_corpus(), out, chunk_docs=37, bucket_entries=500, workers=1, work_dir=work)
    assert stats == {"chunks": 17, "tokenized_chunks": 15} and firsts == list(range(74, 600, 37))
    assert not work.exists()  # removed once the index is published

    monkeypatch.setattr(bb, "score_all", real_score)
    straight = tmp_path / "straight"
    bb.build_bm25_files(_corpus(), straight, chunk_docs=37, bucket_entries=500, workers=1)
    assert _files(out) == _files(straight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25", "straight"]  # no work folder left behind


def _interrupted_build(docs, out: Path, monkeypatch, **kw) -> None:
    """A build stopped after phase 1 (every chunk finished), as Ctrl-C would."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(bb, "score_all", interrupted)
        with pytest.raises(KeyboardInterrupt):
            bb.build_bm25_files(docs, out, chunk_docs=37, bucket_entries=500, workers=1, **kw)
    assert not out.exists() and (out.parent / f".{out.name}.work").is_dir()


def test_resume_reuses_only_chunks_of_the_same_corpus_and_settings(tmp_path, monkeypatch):
    docs = _corpus(200)  # 6 chunks of 37
    out = tmp_path / "bm25"
    ref = tmp_path / "ref"
    bb.build_bm25_files(docs, ref, chunk_docs=37, bucket_entries=500, workers=1, method="bm25+")

    _interrupted_build(docs, out, monkeypatch)  # scoring settings only enter phase 2: chunks reused
    firsts = _counting_tokenizer(monkeypatch)
    stats = bb.build_bm25_files(docs, out, chunk_docs=37, bucket_entries=500, workers=1, method="bm25+")
    assert stats == {"chunks": 6, "tokenized_chunks": 0} and firsts == [] and _files(out) == _files(ref)

    shutil.rmtree(out)
    _interrupted_build(docs, out, monkeypatch)  # other tokenising settings: every chunk again
    stats = bb.build_bm25_files(docs, out, stopwords=None, chunk_docs=37, bucket_entries=500, workers=1)
    assert stats["tokenized_chunks"] == 6

    shutil.rmtree(out)
    _interrupted_build(docs, out, monkeypatch)  # a document of chunk 2 changed: chunks 0 and 1 kept
    edited = [dict(d) for d in docs]
    edited[80]["text"] += " w7"
    firsts.clear()
    stats = bb.build_bm25_files(edited, out, chunk_docs=37, bucket_entries=500, workers=1)
    assert stats["tokenized_chunks"] == 4 and firsts == [74, 111, 148, 185]
    fresh = tmp_path / "fresh"
    bb.build_bm25_files(edited, fresh, chunk_docs=37, bucket_entries=500, workers=1)
    assert _files(out) == _files(fresh)


def test_rows_digest_is_the_same_for_a_store_and_a_list(tmp_path):
    docs = _corpus(100)
    store = write_docstore(tmp_path / "docs", docs)
    assert rows_digest(store, 10, 47) == rows_digest(docs, 10, 47) != rows_digest(docs, 10, 46)
    a, b = (
        {"id": "x", "title": "ab", "text": "c"},
        {"id": "x", "title": "a", "text": "bc"},
    )  # same bytes, split otherwise
    assert rows_digest([a], 0, 1) != rows_digest([b], 0, 1)


def test_bad_stopwords_are_one_line_and_a_failure_before_any_chunk_leaves_nothing(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="bm25 stopwords 'xx'") as e:
        BM25Retriever.build_on_disk(_corpus(10), tmp_path / "idx", stopwords="xx")
    assert "\n" not in str(e.value) and not (tmp_path / "idx").exists()

    def broken(*args):
        raise MemoryError

    monkeypatch.setattr(bb, "_tokenize_rows", broken)
    with pytest.raises(MemoryError):
        bb.build_bm25_files(_corpus(10), tmp_path / "bm25", workers=1)
    assert list(tmp_path.iterdir()) == []  # no work folder: nothing in it to resume from


def test_an_existing_output_folder_is_refused_before_any_work(tmp_path):
    (tmp_path / "bm25").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        bb.build_bm25_files(_corpus(10), tmp_path / "bm25")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25"]


KILLED_STAGE = r"""
import os, signal, sys
import r3rag.retrieval.bm25_build as bb
from r3rag.experiments.pipeline import run_stage

runs, corpus = sys.argv[1], sys.argv[2]
bb.CHUNK_DOCS = 50
real_write = bb._Chunks.write

def write_then_die(self, i, *args):
    real_write(self, i, *args)
    if i == 1:
        os.kill(os.getpid(), signal.SIGKILL)

bb._Chunks.write = write_then_die
run_stage("index", None, ["world=", f"corpus={corpus}"], runs)
print("not killed")
"""


def test_index_stage_killed_mid_build_resumes(tmp_path, monkeypatch):
    """`r3rag index` (bm25, tokenising in worker processes) killed after 2 of 6 chunks: nothing published,
    the workers exit; the rerun tokenises 4 and publishes the same index files as an uninterrupted build."""
    runs, corpus, root = tmp_path / "runs", tmp_path / "c.jsonl", Path(__file__).resolve().parents[1]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in _corpus(300)))
    child = subprocess.run(
        [sys.executable, "-c", KILLED_STAGE, str(runs), str(corpus)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=300,  # orphaned tokenising workers holding the pipes would hang it (bm25_build._exit_with)
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert list_artifacts(runs, "index") == []  # nothing that looks finished
    (work,) = (runs / "index").glob(".work-*")
    assert sorted(p.name for p in work.glob("c*.json")) == ["c00000.json", "c00001.json"]

    monkeypatch.setattr(bb, "CHUNK_DOCS", 50)
    sets = ["world=", f"corpus={corpus}"]
    ref = run_stage("index", None, sets, runs)
    m = ref.manifest["metrics"]
    assert (m["docs"], m["chunks"], m["tokenized_chunks"]) == (300, 6, 4)
    assert not work.exists() and [p.name for p in (runs / "index").iterdir()] == [ref.id]
    straight = run_stage("index", None, sets, tmp_path / "runs2")
    assert _files(ref.path / "index/bm25") == _files(straight.path / "index/bm25")


def test_stemmer_setting_reaches_bm25s(tmp_path):
    """PyStemmer is optional: with it, corpus and queries are stemmed alike; without it, one clear line."""
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="PyStemmer"):
            BM25Retriever.build_on_disk(_corpus(10), tmp_path / "idx", stemmer="english")
        assert not (tmp_path / "idx").exists()  # refused before anything was written
        return
    docs = [{"id": "a", "title": "", "text": "running runners"}, {"id": "b", "title": "", "text": "walks"}]
    r = BM25Retriever.build_on_disk(docs, tmp_path / "idx", stemmer="english")
    assert r.search(["run"], 1)[0][0].doc_id == "a"


@pytest.mark.slow  # the retrieval-scale benchmark as a script: ~9 s (2 AVX2 cores)
def test_scale_benchmark_prints_its_keys(shared_root, tmp_path):
    """benchmarks/retrieval_scale.py at a tiny size: every section runs, the last line has every key,
    and the temp dir is gone (the figures themselves mean nothing at this size)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "retrieval_scale.py"
    args = ["--passages", "15000", "--queries", "256", "--lookups", "500", "--tmp", str(tmp_path)]
    args += ["--sections", "docstore,bm25,server"]  # the dense section has its own test
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    keys = ["bm25_build_s", "bm25_build_rss_gb", "bm25_serve_rss_gb", "bm25_qps_batch64", "docstore_rss_gb"]
    keys += ["server_qps", "server_vs_inprocess", "server_workers_pss_gb"]
    assert all(figures[k] > 0 for k in keys), figures
    assert figures["dense_recall10_vs_flat"] is None and figures["dense_bytes_per_passage"] is None  # not run
    assert figures["repeated"] == 2 and "repeated 2x with distinct ids" in out.stdout
    assert list(tmp_path.iterdir()) == []
