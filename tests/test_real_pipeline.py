"""pipelines/real-smollm2.yaml: every stage on a real pretrained model (SmolLM2-135M-Instruct)
with real questions, in miniature; and the same pipeline planned for a hub model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import r3rag_inprocess

PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "real-smollm2.yaml"
SYSTEMS = ["closed-book", "rag-top3", "ircot", "sft", "rl"]
# A few questions, one epoch (LoRA: make real covers full fine-tuning), 2 GRPO steps of 2 x 2, short
# turns, three of the pipeline's five prompted baselines, documents cut as the policies see them:
# every stage, ~3-4 min on 2 quiet cores.
PROMPTED = (
    "{closed-book: {model: model:latest, template: qa, mode: direct, max_doc_chars: 300}, "
    "rag-top3: {model: model:latest, template: qa, mode: rag, top_k: 3, max_doc_chars: 300}, "
    "ircot: {model: model:latest, protocol: ircot, mode: iterative, max_doc_chars: 300}}"
)
MINIATURE = [
    "model.name=smollm2-135m-instruct",
    "world.limits={train: 3, test: 1}",
    "sft.epochs=1",
    "sft.limit=2",
    "sft.grad_accum=1",
    "sft.warmup_ratio=0",  # one step, and at full lr (a warm-up step is at lr 0)
    "sft.lora=true",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.num_generations=2",
    "rl.max_new_tokens=24",
    "rl.max_turns=2",
    "rl.max_completion_tokens=640",
    "rl.save_steps=0",
    "eval.max_new_tokens=24",
    "eval.max_turns=2",
    f"eval.models={PROMPTED}",
    f"eval.systems=[{', '.join(SYSTEMS)}]",
]


@pytest.mark.parametrize("name", ["real-smollm2.yaml", "real-smollm2-gpu.yaml"])
def test_hub_model_plans_with_one_setting(tmp_path, name):
    out = r3rag_inprocess(
        "run",
        PIPELINE.parent / name,
        "--dry-run",
        "--runs-dir",
        tmp_path,
        "--set",
        "model.source=Qwen/Qwen2.5-3B-Instruct",
    )
    assert out.returncode == 0, out.stderr
    assert "dry run: the config is valid" in out.stdout and "Qwen/Qwen2.5-3B-Instruct" in out.stdout


def test_hub_model_is_recorded_not_copied(tmp_path):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.stages.common import Context, add_model_input, model_location

    ref = run_stage("model", None, ["source=Qwen/Qwen2.5-3B-Instruct"], tmp_path)
    assert json.loads((ref.path / "model.json").read_text())["model"] == "Qwen/Qwen2.5-3B-Instruct"
    inputs: dict = {}
    add_model_input("model:latest", inputs, {}, Context(runs_dir=tmp_path))
    assert model_location("model:latest", inputs) == "Qwen/Qwen2.5-3B-Instruct"


@pytest.mark.slow  # every stage on SmolLM2: ~75 s (2 AVX2 cores)
@pytest.mark.timeout(1500)  # a 135M model through every stage on 2 cores: minutes, more on a loaded machine
def test_every_stage_on_the_real_model(smollm2_runs, shared_root):
    from r3rag.experiments.pipeline import run_pipeline
    from r3rag.training.modeling import load_model

    runs, model_ref = smollm2_runs
    evaluation = run_pipeline(PIPELINE, MINIATURE, runs)
    metrics = json.loads((evaluation.path / "metrics.json").read_text())
    assert list(metrics["systems"]) == SYSTEMS
    assert all(m["n"] == 3 for m in metrics["systems"].values())
    assert set(metrics["systems"]["rag-top3"]["by_dataset"]) == {"hotpotqa", "musique", "2wikimultihopqa"}
    assert metrics["systems"]["rag-top3"]["searches"] == 1.0
    assert "| rl | sft | 3 |" in (evaluation.path / "table.md").read_text()  # the paired comparison
    inputs = evaluation.manifest["inputs"]
    assert inputs["model:closed-book"]["path"] == str(model_ref.path)  # the imported artifact, reused
    sft_dir, rl_dir = Path(inputs["sft"]["path"]), Path(inputs["rl"]["path"])
    steps = [json.loads(line) for line in open(rl_dir / "metrics.jsonl")]
    assert [s["step"] for s in steps] == [1, 2]
    base = load_model(model_ref.path / "model", dtype="float32").state_dict()
    tuned = load_model(sft_dir / "model", dtype="float32").state_dict()
    assert any((base[k] - tuned[k]).abs().max() > 0 for k in base)  # the LoRA update, merged into the weights
    assert set(tuned) == set(base)  # saved merged: a plain model, no adapter keys
    assert json.loads((sft_dir / "policy.json").read_text())["protocol"]["chat"] is True
