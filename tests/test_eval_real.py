"""`r3rag eval` on real data: imported HotpotQA dev questions, its context pool as corpus, a scripted
policy (search the question, answer the top title), several retrievers in one command; numbers
re-derived by hand from the predictions."""

import json

import pytest

from r3rag.core.metrics import exact_match, f1_score
from r3rag.util.jsonl import read_jsonl
from tests.cli_helpers import assert_one_line_error, r3rag, r3rag_inprocess


@pytest.fixture(scope="module")
def hotpot_eval(shared_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hotpot")
    runs = tmp / "runs"
    src = shared_root / "hotpotqa/dev_distractor_ircot_subsample.jsonl"
    out = r3rag(
        "import", str(src), "--out", str(tmp / "q.jsonl"), "--corpus-out", str(tmp / "corpus.jsonl"), "--limit", "60"
    )
    assert out.returncode == 0, out.stderr
    for backend in ("bm25", "rank-bm25"):
        out = r3rag(
            "index",
            "--runs-dir",
            str(runs),
            "--set",
            f"corpus={tmp / 'corpus.jsonl'}",
            "--set",
            "world=",
            "--set",
            f"backend={backend}",
            "--set",
            f"name={backend}",
        )
        assert out.returncode == 0, out.stderr
    idx = {b: next((runs / "index").glob(f"{b}-*")) for b in ("bm25", "rank-bm25")}
    out = r3rag(
        "eval",
        "--runs-dir",
        str(runs),
        "--set",
        f"questions={tmp / 'q.jsonl'}",
        "--set",
        "world=",
        "--set",
        "index=",
        "--set",
        f"retrievers=[{idx['bm25']},{idx['rank-bm25']}]",
        "--set",
        "systems=[top-title]",
        "--set",
        "models.top-title.scripted=top-title",
        "--set",
        "limit=0",
    )
    assert out.returncode == 0, out.stderr
    ev = next((runs / "eval").glob("default-*"))
    return ev, read_jsonl(tmp / "q.jsonl")


def test_scripted_policy_on_hotpotqa_by_hand(hotpot_eval):
    ev, questions = hotpot_eval
    metrics = json.loads((ev / "metrics.json").read_text())
    assert set(metrics["systems"]) == {"top-title@bm25", "top-title@rank-bm25"}
    assert metrics["dataset"] == "q"
    rows = [r for r in read_jsonl(ev / "predictions.jsonl") if r["system"] == "top-title@bm25"]
    assert len(rows) == len(questions) == 60
    by_id = {q["id"]: q for q in questions}
    for r in rows:
        q = by_id[r["id"]]
        assert r["searches"] == 1 and r["finish_reason"] == "answer"
        assert r["answer"] == r["retrieved_docs"][0][0]["title"]  # the script: the top title
        assert r["em"] == exact_match(r["answer"], q["golden_answers"])
        assert r["f1"] == pytest.approx(f1_score(r["answer"], q["golden_answers"]))
        titles = {d["title"].lower() for d in r["retrieved_docs"][0]}
        gold = {t.lower() for t in q["metadata"]["supporting_titles"]}
        assert r["gold_doc_recall"] == pytest.approx(len(titles & gold) / len(gold))
        assert r["type"] is None and r["hops"] == q["metadata"]["hops"]  # no type in this IRCoT subsample
    m = metrics["systems"]["top-title@bm25"]
    assert m["em"] == pytest.approx(sum(r["em"] for r in rows) / 60, abs=1e-4)
    assert m["gold_doc_recall"] == pytest.approx(sum(r["gold_doc_recall"] for r in rows) / 60, abs=1e-4)
    assert m["by_type"] == {} and sum(g["n"] for g in m["by_hops"].values()) == 60
    # a title answers some bridge questions (the answer is an entity), hardly any comparison one
    assert 0 < m["em"] < 0.5 and m["gold_doc_recall"] > 0.3


def test_hand_checked_examples(hotpot_eval):
    """Three rows checked against what a person would conclude reading them."""
    ev, _ = hotpot_eval
    rows = [r for r in read_jsonl(ev / "predictions.jsonl") if r["system"] == "top-title@bm25"]
    right = [r for r in rows if r["em"] == 1.0]
    wrong = [r for r in rows if r["em"] == 0.0]
    assert right and wrong
    r = right[0]  # the top title normalises to a gold answer
    assert any(
        r["answer"].lower().strip() == g.lower().strip() or exact_match(r["answer"], [g]) for g in r["golden_answers"]
    )
    w = next(w for w in wrong if any(c.isdigit() for c in w["golden_answers"][0]))  # a number or a date
    assert not any(c.isdigit() for c in w["answer"]) or w["answer"] not in w["golden_answers"]
    assert w["f1"] < 1.0


def test_retrievers_agree_on_top_titles_mostly(hotpot_eval):
    ev, _ = hotpot_eval
    rows = read_jsonl(ev / "predictions.jsonl")
    a = {r["id"]: r["answer"] for r in rows if r["system"] == "top-title@bm25"}
    b = {r["id"]: r["answer"] for r in rows if r["system"] == "top-title@rank-bm25"}
    assert sum(a[i] == b[i] for i in a) >= 0.9 * len(a)  # the same BM25 scoring, up to tie order


def test_eval_bad_system_names(tmp_path):
    out = r3rag_inprocess("eval", "--runs-dir", str(tmp_path), "--set", "systems=[nope]")
    assert_one_line_error(out, "unknown system 'nope'")
    out = r3rag_inprocess(
        "eval", "--runs-dir", str(tmp_path), "--set", "systems=[x]", "--set", "models.x.scripted=magic"
    )
    assert_one_line_error(out, "unknown script 'magic'")
    out = r3rag_inprocess(
        "eval", "--runs-dir", str(tmp_path), "--set", "systems=[sft]", "--set", "models.y.scripted=top-title"
    )
    assert_one_line_error(out, "'y' is defined but not listed")
