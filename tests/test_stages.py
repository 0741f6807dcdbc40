"""Smoke tests of every stage on a tiny world and a tiny model, through the real code paths."""

import json

from r3rag.core.artifacts import list_artifacts
from r3rag.training.modeling import load_policy
from r3rag.util.jsonl import read_jsonl


def test_world_split_and_probe(pipeline_runs):
    _, refs = pipeline_runs
    m = refs["world"].manifest["metrics"]
    train = read_jsonl(refs["world"].path / "train.jsonl")
    test = read_jsonl(refs["world"].path / "test.jsonl")
    assert m["train_questions"] == len(train) and m["test_questions"] == len(test)
    assert 0.0 <= m["question_only_bridge_doc@3"] <= 0.2  # questions need iterative retrieval


def test_synthesize_keeps_only_verified_chains(pipeline_runs):
    _, refs = pipeline_runs
    rows = read_jsonl(refs["synthesize"].path / "trajectories.jsonl")
    m = refs["synthesize"].manifest["metrics"]
    assert m["accepted"] == len(rows) > 0
    for r in rows[:20]:
        assert r["finish_reason"] == "answer" and r["answer"] in r["golden_answers"]
        needed = [hop["doc_id"] for hop in r["metadata"]["chain"]]
        assert all(d in step for d, step in zip(needed, r["retrieved"]))
        assert [t["role"] for t in r["turns"]][:2] == ["model", "env"]


def test_sft_changed_the_weights_and_saved_a_loadable_policy(pipeline_runs):
    _, refs = pipeline_runs
    model, tok = load_policy(refs["sft"].path)
    m = refs["sft"].manifest["metrics"]
    assert m["steps"] > 0 and m["train_loss"] > 0
    assert tok.convert_tokens_to_ids("</search>") != tok.unk_token_id
    assert json.loads((refs["sft"].path / "policy.json").read_text())["protocol"]["template"] == "minimal"


def test_rl_updates_parameters_from_the_sft_policy(pipeline_runs, tmp_path, monkeypatch):
    """One GRPO step from the SFT artifact moves its weights, and the published policy loads and runs.
    (The shared fixture's rl step may leave them equal: an untrained policy's groups can all score
    0, so here the `em` component alternates within each group; see tests/test_rl_publish.py.)"""
    import shutil

    import torch

    from r3rag.experiments.pipeline import run_stage
    from tests.test_rl_publish import TINY_RL, assert_moved, vary_rewards

    _, refs = pipeline_runs
    assert refs["rl"].manifest["inputs"]["policy"]["id"] == refs["sft"].id
    assert refs["rl"].manifest["metrics"]["steps"] == 1
    runs = tmp_path / "runs"  # a copy: this rl artifact stays out of the shared runs' rl:latest
    for stage in ("world", "index", "sft"):
        shutil.copytree(refs[stage].path, runs / stage / refs[stage].path.name)
    vary_rewards(monkeypatch)
    ref = run_stage("rl", None, [*TINY_RL, "name=moved"], runs)
    assert ref.manifest["inputs"]["policy"]["id"] == refs["sft"].id and ref.manifest["metrics"]["steps"] == 1
    sft, _ = load_policy(refs["sft"].path)
    rl, tok = load_policy(ref.path)
    assert_moved(sft, rl)
    ids = tok("Question : who ?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = rl(input_ids=ids).logits
    assert logits.shape[:2] == ids.shape and torch.isfinite(logits).all()


def test_eval_metrics_shape(pipeline_runs):
    runs, refs = pipeline_runs
    metrics = json.loads((refs["eval"].path / "metrics.json").read_text())
    assert set(metrics["systems"]) == {"direct", "rag", "sft", "rl"}
    for m in metrics["systems"].values():
        assert {"em", "f1", "n"} <= set(m) and m["n"] == 12 and 0 <= m["em"] <= 1
    assert set(metrics["seconds"]) == {"world", "index", "synthesize", "sft", "rl", "eval"}
    preds = read_jsonl(refs["eval"].path / "predictions.jsonl")
    assert len(preds) == 4 * 12 and {p["system"] for p in preds} == {"direct", "rag", "sft", "rl"}
    assert all(p["searches"] == 0 for p in preds if p["system"] == "direct")
    assert all(p["searches"] == 1 for p in preds if p["system"] == "rag")
    assert {"world", "index", "synthesize", "sft", "rl", "eval"} <= {a.stage for a in list_artifacts(runs)}


def test_rerun_reuses_existing_artifacts(pipeline_runs, tmp_path):
    from r3rag.experiments.pipeline import run_stage
    from tests.conftest import TINY_WORLD

    runs, refs = pipeline_runs
    again = run_stage("world", None, [f"{k}={v}" for k, v in TINY_WORLD.items()], runs)
    assert again.path == refs["world"].path
    # another seed, another artifact: built in a runs dir of its own, since in the session's one it
    # would become world:latest for every test that runs after this one in the same process
    other = run_stage("world", None, [f"{k}={v}" for k, v in TINY_WORLD.items()] + ["seed=5"], tmp_path / "runs")
    assert other.id != refs["world"].id


def test_base_stage_then_lora_cold_start(pipeline_runs):
    """`r3rag base` pretrains on fresh worlds' text only; `sft --set base=...` starts from it with LoRA."""
    from r3rag.experiments.pipeline import run_stage
    from r3rag.stages.base import Config, corpus_texts
    from r3rag.util.jsonl import read_jsonl

    runs, refs = pipeline_runs
    test_subjects = {
        " ".join(q["metadata"]["chain"][0]["fact"].split()[:2]) for q in read_jsonl(refs["world"].path / "test.jsonl")
    }
    texts = corpus_texts(Config(worlds=2, world_clusters=3), refs["world"])
    assert texts and not any(name in t for t in texts for name in test_subjects)  # nothing about test entities
    base = run_stage(
        "base",
        None,
        [
            "worlds=2",
            "world_clusters=3",
            "layers=1",
            "hidden=32",
            "heads=2",
            "intermediate=64",
            "max_length=64",
            "bf16=false",
        ],
        runs,
    )
    assert (base.path / "model" / "config.json").is_file() and base.manifest["metrics"]["steps"] > 0
    sft = run_stage(
        "sft",
        None,
        [f"base={base.path}", "lora=true", "epochs=1", "batch_size=16", "lr=1e-2", "bf16=false", "name=lora"],
        runs,
    )
    assert json.loads((sft.path / "policy.json").read_text())["base"] == f"base:{base.id}"
    assert sft.manifest["inputs"]["base"]["content_hash"] == base.content_hash
    from r3rag.training.modeling import load_policy

    model, _ = load_policy(sft.path)
    assert model.config.hidden_size == 32  # the base model's shape, LoRA merged back in
