"""Retrieval backends: bm25 vs rank-bm25 on real HotpotQA, save/load, dense, RRF, errors, `r3rag index`."""

from __future__ import annotations

import json

import pytest

from r3rag.core.protocol import Hit
from r3rag.experiments.pipeline import run_stage
from r3rag.retrieval import load_retriever
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.retrieval.dense import DenseRetriever
from r3rag.retrieval.evaluate import retrieval_metrics
from r3rag.retrieval.hybrid import HybridRetriever
from r3rag.retrieval.rank_bm25_backend import RankBM25Retriever
from r3rag.util.errors import UserError
from r3rag.util.jsonl import write_jsonl

TOPICS = [
    ("Volcano", "A volcano is a rupture in the crust of a planet through which molten lava and ash escape."),
    ("Violin", "The violin is a wooden string instrument played with a bow."),
    ("Photosynthesis", "Plants turn sunlight, water and carbon dioxide into sugar and oxygen in their leaves."),
    ("Bitcoin", "Bitcoin is a decentralised digital currency that works without a central bank."),
    ("Marathon", "The marathon is a long-distance running race of 42.195 kilometres."),
    ("Penicillin", "Penicillin is an antibiotic discovered by Alexander Fleming in 1928."),
]
JOBS = ["baker", "pilot", "nurse", "farmer", "lawyer", "painter", "welder"]
CITIES = ["Velmar", "Korla", "Dunmore", "Ostrava", "Tarsk"]


def small_corpus(n: int = 50) -> list[dict]:
    docs = [{"id": f"t{i}", "title": t, "text": x} for i, (t, x) in enumerate(TOPICS)]
    for i in range(n - len(docs)):
        docs.append(
            {
                "id": f"p{i}",
                "title": f"Person {i}",
                "text": f"Person {i} is a {JOBS[i % 7]} who lives in {CITIES[i % 5]} and was born in {1950 + i}.",
            }
        )
    return docs


# --- bm25 vs the rank_bm25 reference on real data ---------------------------------------------------


def test_bm25_agrees_with_rank_bm25_on_hotpotqa(hotpotqa_pool):
    docs, rows = hotpotqa_pool
    questions = [q["question"] for q in rows[:200]]
    a = BM25Retriever.build(docs).search(questions, 10)
    b = RankBM25Retriever.build(docs).search(questions, 10)
    top1 = sum(x[0].doc_id == y[0].doc_id for x, y in zip(a, b)) / len(questions)
    overlap = sum(len({h.doc_id for h in x} & {h.doc_id for h in y}) / 10 for x, y in zip(a, b)) / len(questions)
    # Measured (3,997 passages, 200 questions): top-1 identical 1.000, mean top-10 overlap 0.9915; the
    # residue is Okapi's idf (no "1 +") reordering near-ties at the bottom of the top 10.
    assert top1 >= 0.98 and overlap >= 0.98, (top1, overlap)


# --- every backend: save + load gives the same ids and scores ---------------------------------------

BUILDERS = {
    "bm25": lambda docs: BM25Retriever.build(docs),
    "rank-bm25": lambda docs: RankBM25Retriever.build(docs),
    "dense": lambda docs: DenseRetriever.build(docs, index_type="hnsw"),
    "hybrid": lambda docs: HybridRetriever.build(docs, candidates=10),
}


@pytest.mark.parametrize("backend", list(BUILDERS))
def test_save_load_roundtrip(backend, tmp_path):
    docs = small_corpus()
    r = BUILDERS[backend](docs)
    r.save(tmp_path / "idx")
    assert json.loads((tmp_path / "idx" / "settings.json").read_text())["backend"] == backend
    loaded = load_retriever(tmp_path / "idx")
    queries = ["Who is a pilot in Korla ?", "string instrument", "born in 1990"]
    before, after = r.search(queries, 5), loaded.search(queries, 5)
    assert [[(h.doc_id, h.score) for h in hs] for hs in before] == [[(h.doc_id, h.score) for h in hs] for hs in after]
    assert loaded.docs == docs and len(loaded.search(["pilot"], 500)[0]) == len(docs)  # k capped at the corpus


# --- dense ------------------------------------------------------------------------------------------


def test_dense_finds_paraphrase_with_every_index_type():
    docs = small_corpus(len(TOPICS))
    queries = [
        "how do green plants make food from light",
        "a currency on the internet with no bank behind it",
        "a fiddle",
        "which drug did Fleming find",
    ]
    want = ["t2", "t3", "t1", "t5"]
    flat = DenseRetriever.build(docs)
    assert [hs[0].doc_id for hs in flat.search(queries, 3)] == want
    assert flat.settings["encoder"] == "all-MiniLM-L6-v2"  # portable, not the install path
    for index_type in ("hnsw", "ivf"):
        r = DenseRetriever.build(docs, index_type=index_type)
        assert [hs[0].doc_id for hs in r.search(queries, 3)] == want, index_type


def test_dense_missing_encoder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no-such-encoder"):
        DenseRetriever.build(small_corpus(8), encoder=str(tmp_path / "no-such-encoder"))


# --- hybrid -----------------------------------------------------------------------------------------


class Stub:
    def __init__(self, ids):
        self.ids, self.asked = ids, []

    def search(self, queries, k):
        self.asked.append(k)
        return [[Hit(i, 0.0, i.upper(), f"text {i}") for i in self.ids[:k]] for _ in queries]


def test_hybrid_rrf_by_hand():
    docs = [{"id": i, "title": i.upper(), "text": f"text {i}"} for i in "abcde"]
    sparse, dense = Stub(["a", "b", "c"]), Stub(["c", "a", "d"])
    h = HybridRetriever(sparse, dense, docs, {"backend": "hybrid", "rrf_k": 60, "candidates": 4})
    (hits,) = h.search(["q"], 3)
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63
    assert [x.doc_id for x in hits] == ["a", "c", "b"]
    assert [x.score for x in hits] == pytest.approx([1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62])
    assert sparse.asked == dense.asked == [4]  # max(k, candidates) from each side
    assert len(h.search(["q"], 10)[0]) == 4 and sparse.asked[-1] == 5  # k capped at 5 docs; only 4 found


# --- r3rag index ------------------------------------------------------------------------------------


def _corpus_file(tmp_path, docs, name="c.jsonl"):
    path = tmp_path / name
    write_jsonl(path, docs)
    return path


def test_index_errors(tmp_path):
    runs = tmp_path / "runs"
    good = _corpus_file(tmp_path, small_corpus(8))
    with pytest.raises(UserError, match=r"unknown backend 'nope' \(available: bm25, rank-bm25, dense, hybrid\)"):
        run_stage("index", None, ["backend=nope", "world=", f"corpus={good}"], runs)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "title": "t", "text": "x"}\n{"id": "2", "text": \n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2: malformed JSON"):
        run_stage("index", None, ["world=", f"corpus={bad}"], runs)
    dup = _corpus_file(tmp_path, small_corpus(8) + [{"id": "t0", "title": "x", "text": "y"}], "dup.jsonl")
    with pytest.raises(UserError, match=r"dup\.jsonl:9: duplicate id 't0' \(first on line 1\)"):
        run_stage("index", None, ["world=", f"corpus={dup}"], runs)
    with pytest.raises(UserError, match="no-enc"):
        run_stage("index", None, ["backend=dense", f"encoder={tmp_path}/no-enc", "world=", f"corpus={good}"], runs)
    with pytest.raises(UserError, match="not both"):
        run_stage("index", None, [f"corpus={good}"], runs)


@pytest.mark.parametrize("backend", ["dense", "hybrid"])
def test_index_stage_end_to_end(backend, tmp_path):
    runs, docs = tmp_path / "runs", small_corpus(20)
    corpus = _corpus_file(tmp_path, docs)
    args = [f"backend={backend}", "world=", f"corpus={corpus}"]
    ref = run_stage("index", None, args, runs)
    assert ref.manifest["metrics"]["docs"] == 20 and len(ref.manifest["metrics"]["corpus_sha256"]) == 64
    r = load_retriever(ref.path / "index")
    assert r.search(["wooden string instrument"], 2)[0][0].doc_id == "t1"
    assert run_stage("index", None, args, runs).id == ref.id  # same corpus bytes: reused
    write_jsonl(corpus, docs[:-1])  # an edited corpus is a new artifact
    assert run_stage("index", None, args, runs).id != ref.id


# --- evaluation -------------------------------------------------------------------------------------


def test_retrieval_metrics_by_hand():
    docs = small_corpus(len(TOPICS))
    r = BM25Retriever.build(docs)
    questions = [
        {
            "question": "lava volcano",
            "golden_answers": ["molten lava"],
            "metadata": {"supporting_titles": ["Volcano"], "paragraphs": [{"title": "Bitcoin", "is_supporting": True}]},
        },
        {"question": "planet crust", "golden_answers": ["Fleming"], "metadata": {}},
    ]
    m = retrieval_metrics(r, questions, ks=(1, 6), hop_queries=[["lava"], ["digital currency", "antibiotic"]])
    assert m["n"] == 2 and m["n_gold"] == 1
    assert m["recall@1"] == 0.5 and m["recall@6"] == 1.0  # Volcano first, Bitcoin somewhere in the 6
    assert m["answer_recall@1"] == 0.5 and m["answer_recall@6"] == 1.0  # "planet crust" finds Volcano first
    assert m["hops_answer_recall@1"] == 1.0  # "antibiotic" finds Penicillin (Fleming)


def test_retrieval_metrics_match_gold_as_gold_docs_does():
    """Ids win over titles (the synthetic world names gold by id); titles compare as r3rag.core.gold_docs does."""
    r = BM25Retriever.build(small_corpus(len(TOPICS)))
    by_id = {"question": "lava volcano", "golden_answers": ["x"], "metadata": {"supporting_docs": ["t0", "t3"]}}
    by_title = {"question": "lava volcano", "golden_answers": ["x"], "metadata": {"supporting_titles": [" volcano"]}}
    m = retrieval_metrics(r, [by_id, by_title], ks=(1,))
    assert m["n_gold"] == 2 and m["recall@1"] == (0.5 + 1.0) / 2  # t0 (Volcano) first; t3 (Bitcoin) not


# --- bm25: the sparse-product search gives bm25s' own `retrieve` results ------------------------------

import numpy as np  # noqa: E402


def _assert_same_as_bm25s(r: BM25Retriever, queries: list[str], k: int = 10) -> int:
    """Ours vs bm25s' retrieve: same scores (1e-5 rel.) and ids in order, up to exact score ties.

    A tie group inside the top k must hold the same ids; one that runs past position k only has to
    hold ids with that score (bm25s picks arbitrary members). Returns how many hits were compared.
    """
    import bm25s

    tokens = bm25s.tokenize(queries, stopwords=r.settings["stopwords"], return_ids=False, show_progress=False)
    ref_idx, ref_scores = r.model.retrieve(tokens, k=k, show_progress=False, n_threads=0)
    ours = r.search(queries, k)
    pos = {d["id"]: i for i, d in enumerate(r.docs)}
    n = 0
    for q, toks, hits, ri, rs in zip(queries, tokens, ours, ref_idx, ref_scores):
        full = r.model.get_scores(toks) if toks else np.zeros(len(r.docs), dtype=np.float32)
        oi = np.array([pos[h.doc_id] for h in hits])
        os_ = np.array([h.score for h in hits])
        assert len(hits) == k, q
        np.testing.assert_allclose(os_, rs, rtol=1e-5, atol=0, err_msg=q)
        np.testing.assert_allclose(full[oi], os_, rtol=1e-5, atol=0, err_msg=q)
        for v in np.unique(rs):
            at = np.flatnonzero(rs == v)
            if len(at) == 1 and (full == v).sum() == 1:
                assert oi[at[0]] == ri[at[0]], (q, at[0])
            elif (full == v).sum() == len(at):  # the whole tie group is inside the top k
                assert set(oi[at]) == set(ri[at]), (q, v)
            else:
                assert np.all(full[oi[at]] == v), (q, v)
        n += k
    return n


def test_bm25_search_matches_bm25s_retrieve_on_hotpotqa(hotpotqa_pool):
    docs, rows = hotpotqa_pool
    questions = [q["question"] for q in rows]
    r = BM25Retriever.build(docs)
    assert _assert_same_as_bm25s(r, questions) == 10 * len(questions)


def test_bm25_search_matches_bm25s_retrieve_on_world(tmp_path):
    from r3rag.data.world import WorldConfig, generate_world

    world = generate_world(WorldConfig(seed=1))
    queries = [hop["query"] for q in world.test for hop in q["metadata"]["chain"]]
    assert len(queries) > 50
    built = BM25Retriever.build(world.docs)
    _assert_same_as_bm25s(built, queries)
    built.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx")  # memory-mapped arrays
    assert isinstance(loaded.model.scores["indices"], np.memmap)
    _assert_same_as_bm25s(loaded, queries)
    # A repeated token counts once per occurrence, as in bm25s.
    q = queries[0]
    _assert_same_as_bm25s(loaded, [q, f"{q} {q}", f"{q} {q.split()[0]}"])
    # Negative idf (robertson: unmatched docs can outrank matched ones) and a non-occurrence
    # constant (bm25l) take the dense fallback or shift every score.
    for method in ("robertson", "bm25l"):
        _assert_same_as_bm25s(BM25Retriever.build(world.docs, method=method), queries[:300])


def test_bm25_search_empty_and_unknown_queries():
    docs = small_corpus()
    r = BM25Retriever.build(docs)
    for q in ["", "the a of", "zzqx unknownword", "!!"]:
        hits = r.search([q], 5)[0]
        assert [h.doc_id for h in hits] == [d["id"] for d in docs[:5]] and all(h.score == 0.0 for h in hits), q
    # Mixed with real queries in one batch, and k larger than the matching docs: zero-score filler
    # (distinct documents, in the per-query tie order).
    out = r.search(["violin bow", "", "Penicillin"], 4)
    assert out[0][0].doc_id == "t1" and out[2][0].doc_id == "t5" and out[1][0].score == 0.0
    filler = [h.doc_id for h in out[2][1:]]
    assert len(set(filler)) == 3 and "t5" not in filler and all(h.score == 0.0 for h in out[2][1:])
    assert r.search(["Penicillin"], 4)[0] == out[2]  # deterministic
    assert r.search([], 3) == []
