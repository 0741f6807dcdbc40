"""Reader baselines (issue 17): the oracle's reader trajectories (closed-book, single-shot RAG
at top k, gold documents) in the `qa` framing, their loss masks, a tiny reader SFT and its
evaluation through eval's direct and rag modes."""

import pytest

from r3rag.core.artifacts import resolve
from r3rag.core.protocol import Protocol
from r3rag.experiments.pipeline import run_stage
from r3rag.training.helpers import IGNORE, tokenize_trajectory
from r3rag.util.errors import UserError
from r3rag.util.jsonl import read_jsonl
from tests.conftest import TINY_WORLD

QA = Protocol(template="qa", doc_style="plain")
READER = ["teacher=oracle", "template=qa", "doc_style=plain"]
TINY_SFT = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "epochs=1", "batch_size=16", "lr=1e-2", "bf16=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = tmp_path_factory.mktemp("reader-runs") / "runs"
    run_stage("world", None, [f"{k}={v}" for k, v in {**TINY_WORLD, "named": 0.3}.items()], runs)
    run_stage("index", None, [], runs)
    return runs


def _reader_data(runs, reader: str, top_k: int = 3):
    return run_stage("synthesize", None, READER + [f"reader={reader}", f"top_k={top_k}", f"name={reader}{top_k}"], runs)


def _questions(runs) -> dict[str, dict]:
    world = resolve("world:latest", "world", runs).path
    return {q["id"]: q for q in read_jsonl(world / "train.jsonl")}


@pytest.mark.parametrize("reader, top_k", [("closed-book", 3), ("rag", 3), ("rag", 7), ("gold", 3)])
def test_reader_trajectories_answer_after_the_prefill_with_their_documents_in_the_prompt(runs, reader, top_k):
    ref = _reader_data(runs, reader, top_k)
    rows, questions = read_jsonl(ref.path / "trajectories.jsonl"), _questions(runs)
    assert ref.manifest["metrics"]["acceptance_rate"] == 1.0 and len(rows) == len(questions)
    for r in rows:
        q = questions[r["id"]]
        assert [(t["role"], t["text"]) for t in r["turns"]] == [
            ("env", "<answer> "),
            ("model", f"{q['golden_answers'][0]} </answer>"),
        ]
        assert r["finish_reason"] == "answer" and r["answer"] == q["golden_answers"][0]
        if reader == "closed-book":
            assert r["documents"] == [] and r["prompt"] == QA.prompt(q["question"])
            continue
        docs = r["documents"][0]
        assert len(r["documents"]) == 1 and all(d["text"] in r["prompt"] for d in docs)
        if reader == "gold":  # every gold document, nothing else
            assert sorted(d["id"] for d in docs) == sorted(q["metadata"]["supporting_docs"])
        else:
            assert len(docs) == top_k


def test_reader_loss_covers_the_answer_and_eos_only_and_the_prompt_keeps_its_documents(runs):
    from r3rag.training.modeling import train_word_tokenizer

    rows = read_jsonl(_reader_data(runs, "rag").path / "trajectories.jsonl")
    tok = train_word_tokenizer([r["prompt"] for r in rows] + [t["text"] for r in rows for t in r["turns"]])
    for r in rows[:20]:
        ids, labels = tokenize_trajectory(r, tok, 0, QA)
        prompt = tok.encode(r["prompt"], add_special_tokens=False)  # the stored prompt, documents and all
        prefill = tok.encode("<answer> ", add_special_tokens=False)
        answer = tok.encode(r["turns"][1]["text"], add_special_tokens=False)
        assert ids == prompt + prefill + answer + [tok.eos_token_id]
        assert labels == [IGNORE] * (len(prompt) + len(prefill)) + answer + [tok.eos_token_id]


def test_reader_settings_are_checked(runs):
    with pytest.raises(UserError, match="template=qa"):
        run_stage("synthesize", None, ["reader=rag", "template=minimal"], runs)
    with pytest.raises(UserError, match="allowed"):
        run_stage("synthesize", None, READER + ["reader=oracle"], runs)


def test_a_tiny_reader_trains_and_eval_runs_it_closed_book_and_with_rag(runs):
    """A reader SFT on the rag reader's trajectories changes the model, saves the qa protocol,
    and eval's built-in direct and rag systems run it (answers are not the point at this size)."""
    import torch

    from r3rag.training.helpers import load_protocol_dict
    from r3rag.training.modeling import load_policy, tiny_model

    data = _reader_data(runs, "rag")
    sft = run_stage("sft", None, TINY_SFT + [f"data={data.path}", "name=reader"], runs)
    assert load_protocol_dict(sft.path)["template"] == "qa"
    model, tok = load_policy(sft.path)
    start = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64)  # the seeded init sft started from
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), start.state_dict().values()))
    assert sft.manifest["metrics"]["steps"] > 0
    ev = run_stage(
        "eval", None, [f"sft={sft.path}", "rl=", "systems=[direct,rag]", "limit=8", "top_k=3", "max_new_tokens=8"], runs
    )
    preds = read_jsonl(ev.path / "predictions.jsonl")
    assert {p["system"] for p in preds} == {"direct", "rag"} and len(preds) == 16
    assert {p["searches"] for p in preds if p["system"] == "rag"} == {1}
    assert {p["searches"] for p in preds if p["system"] == "direct"} == {0}
    assert all(p["turns"][0] == {"role": "env", "text": "<answer> "} for p in preds)
