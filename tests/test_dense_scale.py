"""Dense retrieval at scale: resumable fp16 encoding (a killed run resumes), the index types behind one
setting (IVF-PQ + exact re-rank vs Flat: recall and bytes per passage), memory-mapped loading, and bad
input (a foreign dimension, a truncated file, an index and corpus of different sizes, a killed build)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from r3rag.core.artifacts import list_artifacts
from r3rag.experiments.pipeline import run_stage
from r3rag.retrieval import encode, faiss_index, load_retriever
from r3rag.retrieval.dense import DenseRetriever, Encoder
from r3rag.retrieval.faiss_index import IndexSpec
from r3rag.util.errors import UserError
from r3rag.util.jsonl import read_jsonl, write_jsonl

WORDS = "river castle engine violin harbor orchard glacier lantern meadow falcon copper saddle".split()


def passages(n: int) -> list[str]:
    """n distinct short real-word passages (deterministic)."""
    rng = np.random.default_rng(0)
    return [f"Item {i}: the {' '.join(rng.choice(WORDS, 6))} near {WORDS[i % len(WORDS)]}." for i in range(n)]


def docs_of(texts: list[str]) -> list[dict]:
    return [{"id": f"d{i}", "title": f"Doc {i}", "text": t} for i, t in enumerate(texts)]


# --- chunked, resumable encoding --------------------------------------------------------------------

# Run in a child process: the encoder writes two shards, then the process is SIGKILLed (as a kill -9 would).
DIE_AFTER_TWO_SHARDS = r"""
import os, signal
from r3rag.retrieval import encode

written, real_write = [], encode._write_shard

def write_then_die(path, vecs):
    real_write(path, vecs)
    written.append(path)
    if len(written) == 2:
        os.kill(os.getpid(), signal.SIGKILL)

encode._write_shard = write_then_die
"""

KILLED_CHILD = (
    DIE_AFTER_TWO_SHARDS
    + r"""
import sys
import torch
from pathlib import Path
from r3rag.retrieval.dense import Encoder
from tests.test_dense_scale import passages

out, threads = Path(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
encode.encode_corpus(passages(50), out, Encoder(""), "fp", chunk_size=10, batch_size=4)
print("not killed")
"""
)


class Counting:
    """The real encoder, counting how many texts it embeds."""

    def __init__(self, enc: Encoder):
        self.enc, self.dim, self.texts = enc, enc.dim, 0

    def encode(self, texts, batch_size, normalize):
        self.texts += len(texts)
        return self.enc.encode(texts, batch_size, normalize)


@pytest.fixture(scope="module")
def minilm():
    return Encoder("")


def test_killed_encoding_resumes_without_redoing_chunks(tmp_path, minilm):
    out = tmp_path / "shards"
    root = Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, str(out), str(torch.get_num_threads())],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert sorted(p.name for p in out.glob("emb-*.npy")) == ["emb-00000.npy", "emb-00001.npy"]
    (out / "emb-00002.npy.part").write_bytes(b"half a shard")  # as if killed mid-write

    counting = Counting(minilm)
    resumed = encode.encode_corpus(passages(50), out, counting, "fp", chunk_size=10, batch_size=4)
    assert (resumed.encoded, counting.texts) == (3, 30)  # chunks 2, 3 and 4 only
    assert not list(out.glob("*.part"))

    straight = encode.encode_corpus(passages(50), tmp_path / "straight", minilm, "fp", chunk_size=10, batch_size=4)
    a, b = resumed.sample(50), straight.sample(50)
    assert a.shape == (50, 384) and np.array_equal(a, b)

    again = Counting(minilm)  # complete: nothing to do; another fingerprint: everything again
    assert encode.encode_corpus(passages(50), out, again, "fp", chunk_size=10).encoded == 0 and again.texts == 0
    assert encode.encode_corpus(passages(50), out, again, "other", chunk_size=10).encoded == 5


def test_a_damaged_shard_is_encoded_again(tmp_path, minilm):
    out = tmp_path / "s"
    encode.encode_corpus(passages(20), out, minilm, "fp", chunk_size=10)
    np.save(out / "emb-00001.npy", np.zeros((3, 384), dtype=np.float16))  # wrong shape (a disk error)
    counting = Counting(minilm)
    shards = encode.encode_corpus(passages(20), out, counting, "fp", chunk_size=10)
    assert counting.texts == 10 and shards.chunk(1).shape == (10, 384)


# --- index types: IVF-PQ + re-rank vs Flat ----------------------------------------------------------


class Precomputed:
    """An 'encoder' that returns given vectors (texts are their row numbers): index tests without a model."""

    def __init__(self, vecs: np.ndarray):
        self.vecs, self.dim = vecs, vecs.shape[1]

    def encode(self, texts, batch_size, normalize):
        return self.vecs[[int(t) for t in texts]]


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors around 64 topics, like sentence embeddings (uniform random ones have no neighbours)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(64, dim))
    x = centres[rng.integers(0, 64, n)] + 0.6 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at(k: int, got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g[:k]) & set(w[:k])) / k for g, w in zip(got, want)]))


@pytest.fixture(scope="module")
def vectors_4k(tmp_path_factory):
    vecs = clustered(4000, 384, seed=1)
    out = tmp_path_factory.mktemp("shards")
    shards = encode.encode_corpus([str(i) for i in range(4000)], out, Precomputed(vecs), "v", chunk_size=1000)
    return shards, clustered(200, 384, seed=2)


@pytest.fixture(scope="module")
def built(vectors_4k):
    """Each index type built once on the 4k vectors (training PQ is the slow part)."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = faiss_index.build(vectors_4k[0], IndexSpec(kind, nprobe=16))
        return cache[kind]

    return get


def test_ivf_pq_with_rerank_recalls_what_flat_finds(vectors_4k, built):
    shards, queries = vectors_4k
    flat, _ = built("flat")
    _, want = flat.search(queries, 10)
    stored = shards.sample(shards.num_docs)  # the fp16 vectors refine_k re-ranks with
    pq, s = built("ivf-pq")
    results = {
        "ivf-pq+refine": recall_at(10, faiss_index.search(pq, {**s, "refine_k": 10}, queries, 10, stored)[1], want)
    }
    for kind in ("ivf-pq", "ivf-sq8", "ivf-flat", "hnsw"):
        index, s = built(kind)
        results[kind] = recall_at(10, faiss_index.search(index, s, queries, 10, stored)[1], want)
    assert results["ivf-pq+refine"] >= 0.9, results
    assert results["ivf-pq+refine"] > results["ivf-pq"]  # the re-rank is what lifts PQ
    assert min(results["ivf-sq8"], results["ivf-flat"], results["hnsw"]) >= 0.9, results


def test_bytes_per_passage_are_as_designed(vectors_4k, built, tmp_path):
    shards, _ = vectors_4k
    n, dim = shards.num_docs, shards.dim
    sizes = {}
    for kind in ("flat", "ivf-flat", "ivf-sq8", "ivf-pq"):
        index, s = built(kind)
        faiss_index.write(index, tmp_path / f"{kind}.index")
        sizes[kind] = ((tmp_path / f"{kind}.index").stat().st_size, s)
    assert sizes["ivf-pq"][1]["pq_m"] == 64 and sizes["ivf-pq"][1]["pq_nbits"] == 8  # 384 = 64 x 6
    fixed = {  # what every index stores once: coarse centroids, PQ codebooks / SQ ranges
        "flat": 0,
        "ivf-flat": sizes["ivf-flat"][1]["nlist"] * dim * 4,
        "ivf-sq8": sizes["ivf-sq8"][1]["nlist"] * dim * 4 + 2 * dim * 4,
        "ivf-pq": sizes["ivf-pq"][1]["nlist"] * dim * 4 + 256 * dim * 4,
    }
    per_passage = {"flat": 4 * dim, "ivf-flat": 4 * dim + 8, "ivf-sq8": dim + 8, "ivf-pq": 64 + 8}
    for kind, (size, _) in sizes.items():
        expected = n * per_passage[kind] + fixed[kind]
        assert expected <= size <= expected + 64 * 1024, (kind, size, expected)  # + headers and list sizes


def test_read_maps_the_file_instead_of_loading_it(vectors_4k, built, tmp_path):
    _, queries = vectors_4k
    index, s = built("ivf-pq")
    path = tmp_path / "pq.index"
    faiss_index.write(index, path)
    mapped = faiss_index.read(path)
    if Path("/proc/self/maps").exists():
        assert str(path.resolve()) in Path("/proc/self/maps").read_text()  # the codes stay in the page cache
    a = faiss_index.search(index, s, queries, 10)
    b = faiss_index.search(mapped, s, queries, 10)
    assert np.array_equal(a[1], b[1]) and np.allclose(a[0], b[0])


def test_index_settings_are_checked():
    with pytest.raises(UserError, match="index_type 'ivf-opq': expected one of flat, hnsw, ivf-flat"):
        IndexSpec("ivf-opq").check()
    with pytest.raises(UserError, match="nprobe 0: must be at least 1"):
        IndexSpec("ivf-pq", nprobe=0).check()
    with pytest.raises(UserError, match="pq_m 7: must divide the vector dimension 384"):
        faiss_index.resolve(IndexSpec("ivf-pq", pq_m=7).check(), 5000, 384)
    assert IndexSpec("ivf").check().index_type == "ivf-flat"  # the older name still loads
    tiny = faiss_index.resolve(IndexSpec("ivf-pq").check(), 30, 384)
    assert tiny["nlist"] == 1 and tiny["pq_nbits"] < 8  # a tiny corpus still trains


# --- real text, end to end --------------------------------------------------------------------------


def test_real_text_ivf_pq_refine_matches_flat(tmp_path, minilm):
    docs = docs_of(passages(600))
    flat = DenseRetriever.build(docs, index_type="flat", chunk_size=200)
    pq = DenseRetriever.build(docs, index_type="ivf-pq", refine_k=8, nprobe=8, chunk_size=200, work_dir=tmp_path / "w")
    assert pq.settings["nlist"] == 15 and pq.build_stats["chunks"] == 3
    queries = [f"the {a} and the {b}" for a, b in zip(WORDS, WORDS[3:] + WORDS[:3])]
    got = [[h.doc_id for h in hs] for hs in pq.search(queries, 10)]
    want = [[h.doc_id for h in hs] for hs in flat.search(queries, 10)]
    assert recall_at(10, np.array(got), np.array(want)) >= 0.9
    pq.save(tmp_path / "index")
    assert (tmp_path / "index" / "vectors.npy").is_file()
    again = DenseRetriever.load(tmp_path / "index")
    assert [[h.doc_id for h in hs] for hs in again.search(queries, 10)] == got


# --- bad input --------------------------------------------------------------------------------------


@pytest.fixture
def saved_index(tmp_path):
    path = tmp_path / "index"
    DenseRetriever.build(docs_of(passages(30))).save(path)
    return path


def test_an_index_of_another_dimension_is_one_line(saved_index):
    import faiss

    other = faiss.IndexFlatIP(768)
    other.add(np.zeros((30, 768), dtype=np.float32))
    faiss.write_index(other, str(saved_index / "faiss.index"))
    with pytest.raises(UserError, match=r"holds 768-dimensional vectors but the encoder makes 384-dimensional"):
        load_retriever(saved_index)


def test_a_truncated_index_file_is_one_line(saved_index):
    f = saved_index / "faiss.index"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(UserError, match=r"faiss\.index: not a readable faiss index \(truncated or corrupt"):
        load_retriever(saved_index)


def test_an_index_and_corpus_of_different_lengths_is_one_line(saved_index):
    docs = read_jsonl(saved_index / "docs.jsonl")
    write_jsonl(saved_index / "docs.jsonl", docs[:-1])
    with pytest.raises(UserError, match="holds 30 vectors but the corpus has 29 passages"):
        load_retriever(saved_index)


KILLED_STAGE = (
    DIE_AFTER_TWO_SHARDS
    + r"""
import sys
from r3rag.experiments.pipeline import run_stage

runs, corpus = sys.argv[1], sys.argv[2]
run_stage("index", None, ["backend=dense", "index_type=ivf-pq", "refine_k=4", "chunk_size=40", "world=",
                          f"corpus={corpus}"], runs)
print("not killed")
"""
)


def test_a_killed_dense_build_publishes_nothing_and_resumes(tmp_path):
    runs, corpus = tmp_path / "runs", tmp_path / "c.jsonl"
    write_jsonl(corpus, docs_of(passages(150)))
    root = Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_STAGE, str(runs), str(corpus)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert list_artifacts(runs, "index") == []  # nothing that looks finished
    (work,) = (runs / "index").glob(".work-*")
    assert len(list(work.glob("emb-*.npy"))) == 2

    args = ["backend=dense", "index_type=ivf-pq", "refine_k=4", "chunk_size=40", "world=", f"corpus={corpus}"]
    ref = run_stage("index", None, args, runs)
    m = ref.manifest["metrics"]
    assert (m["encoded_chunks"], m["chunks"], m["docs"]) == (2, 4, 150)  # chunks 2 and 3 only
    assert not work.exists() and not list((runs / "index").glob(".tmp-*"))  # shards and temp dir gone
    settings = json.loads((ref.path / "index" / "settings.json").read_text())
    assert settings["index_type"] == "ivf-pq" and settings["refine_k"] == 4
    hits = load_retriever(ref.path / "index").search([passages(150)[7]], 3)[0]
    assert hits[0].doc_id == "d7"


# --- the benchmark's dense section ------------------------------------------------------------------


@pytest.mark.slow  # a subprocess that loads MiniLM and faiss: ~30 s, like the other benchmark scripts' tests
def test_dense_benchmark_section_prints_its_keys(shared_root, tmp_path):
    """benchmarks/retrieval_scale.py --sections dense at a tiny size: the keys, sane values, no temp dir left."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "retrieval_scale.py"
    args = ["--passages", "200", "--sections", "dense", "--tmp", str(tmp_path)]
    args += ["--dense-passages", "200", "--dense-queries", "64", "--dense-chunk-size", "100"]
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["dense_recall10_vs_flat"] >= 0.9 and figures["dense_passages"] == 200, figures
    assert 0 < figures["dense_recall10_pq_only"] <= figures["dense_recall10_vs_flat"]
    assert figures["dense_refine_bytes_per_passage"] > 2 * 384  # fp16 rows + the .npy header
    assert figures["dense_encode_passages_per_s"] > 0 and figures["dense_bytes_per_passage"] > 0
    assert list(tmp_path.iterdir()) == []


def test_dense_benchmark_synthesizes_distinct_passages_beyond_the_pools(shared_root):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from retrieval_scale_dense import dense_texts
    finally:
        sys.path.pop(0)
    pool, _ = dense_texts(shared_root, 1)
    texts, synthesized = dense_texts(shared_root, 20_000)
    assert len(texts) == 20_000 and len(set(texts)) == 20_000 and synthesized > 0 and texts[0] == pool[0]
