"""What `rl` publishes: a LoRA run's merged policy that eval loads, a run started from a plain model
directory, and nothing half-written when publishing fails.

Every run here trains one GRPO step of the tiny SFT policy with an `em` component that alternates
0, 1, 0, 1 in call order (`vary_rewards`): each group then has reward variance whatever the
untrained policy writes, so the step has non-zero advantages and must move the weights."""

from __future__ import annotations

import errno
import itertools
import json
import shutil

import pytest
import torch

from r3rag.experiments.pipeline import run_stage
from r3rag.training.modeling import load_policy
from r3rag.util.errors import UserError

TINY_RL = [
    "steps=1",
    "prompts_per_step=2",
    "num_generations=4",
    "bf16=false",
    "max_turns=3",
    "max_new_tokens=16",
    "lr=1e-2",
    "save_steps=0",
]


def vary_rewards(monkeypatch) -> None:
    from r3rag.rl import rewards

    calls = itertools.count()
    monkeypatch.setattr(rewards, "exact_match_reward", lambda traj, example: float(next(calls) % 2))


def changed_parameters(before, after) -> dict[str, float]:
    """name -> largest absolute change, for the parameters that differ (same architecture asserted)."""
    a, b = dict(before.named_parameters()), dict(after.named_parameters())
    assert a.keys() == b.keys()
    diffs = {name: (a[name] - b[name]).abs().max().item() for name in a}
    return {name: d for name, d in diffs.items() if d > 0}


def assert_moved(before, after) -> None:
    changed = changed_parameters(before, after)
    # Adam's first step moves every weight with a gradient by about lr (1e-2): not rounding noise
    assert changed and max(changed.values()) > 1e-3, changed


@pytest.fixture
def own_runs(pipeline_runs, tmp_path):
    """A copy of the shared world, index and SFT artifacts: the rl artifacts made here (and `rl:latest`)
    stay out of the runs other test modules read."""
    runs, refs = pipeline_runs
    dest = tmp_path / "runs"
    for stage in ("world", "index", "sft"):
        shutil.copytree(refs[stage].path, dest / stage / refs[stage].path.name)
    return dest, refs["sft"]


def test_lora_grpo_publishes_a_merged_policy_that_eval_loads(own_runs, monkeypatch):
    runs, sft = own_runs
    vary_rewards(monkeypatch)
    ref = run_stage("rl", None, [*TINY_RL, "name=lora", "lora=true"], runs)
    model_dir = ref.path / "model"
    assert not (model_dir / "adapter_config.json").exists()  # merged: a plain transformers model
    assert_moved(load_policy(sft.path)[0], load_policy(ref.path)[0])
    # the eval stage loads it as it loads every policy artifact, and answers through the env loop
    ev = run_stage(
        "eval",
        None,
        ["name=lora", f"rl={ref.path}", "systems=[rl]", "limit=4", "max_turns=2", "max_new_tokens=8"],
        runs,
    )
    assert ev.manifest["inputs"]["rl"]["id"] == ref.id
    metrics = json.loads((ev.path / "metrics.json").read_text())["systems"]
    assert metrics["rl"]["n"] == 4 and 0 <= metrics["rl"]["em"] <= 1


def test_rl_starts_from_a_plain_model_directory(own_runs, tmp_path, monkeypatch):
    """`model=` (Search-R1's recipe: RL from a base model) instead of an SFT artifact: no policy input,
    the protocol from the rl settings, the weights trained from that directory's."""
    runs, sft = own_runs
    plain = tmp_path / "plain-model"
    shutil.copytree(sft.path / "model", plain)  # weights and tokenizer, no manifest: not an artifact
    vary_rewards(monkeypatch)
    ref = run_stage("rl", None, [*TINY_RL, "name=plain", f"model={plain}", "template=minimal", "doc_style=plain"], runs)
    assert "policy" not in ref.manifest["inputs"] and ref.manifest["config"]["model"] == str(plain)
    policy = json.loads((ref.path / "policy.json").read_text())
    assert policy["base"] == str(plain)
    assert (policy["protocol"]["template"], policy["protocol"]["doc_style"]) == ("minimal", "plain")
    start, _ = load_policy(sft.path)  # the same weights as `plain`
    assert_moved(start, load_policy(ref.path)[0])


def _broken_save_policy(model, tokenizer, out, protocol, base):
    """Half a policy, then a full disk."""
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "model" / "config.json").write_text("{}")
    raise OSError(errno.ENOSPC, "No space left on device", str(out / "model" / "model.safetensors"))


def _broken_plot(metrics_path, png):
    """The last output of the publish, after the policy was saved."""
    png.write_bytes(b"\x89PNG half")
    raise RuntimeError("plot failed")


@pytest.mark.parametrize("failure", ["disk full saving the policy", "error after the policy was saved"])
def test_a_failed_publish_leaves_nothing_half_written(own_runs, monkeypatch, failure):
    """Rank 0 (the only process here) fails while publishing: no artifact, no temp directory, nothing
    `rl:latest` resolves to; the same command then publishes a complete, loadable policy."""
    from r3rag.core.artifacts import list_artifacts, resolve
    from r3rag.stages import rl
    from r3rag.training import observe

    runs, _ = own_runs
    vary_rewards(monkeypatch)
    with monkeypatch.context() as m:
        if failure.startswith("disk full"):
            m.setattr(rl, "save_policy", _broken_save_policy)
            expected = pytest.raises(UserError, match="nothing was published")
        else:
            m.setattr(observe, "plot_rewards", _broken_plot)
            expected = pytest.raises(RuntimeError, match="plot failed")
        with expected:
            run_stage("rl", None, [*TINY_RL, "name=broken"], runs)
    stage_dir = runs / "rl"
    leftovers = sorted(p.name for p in stage_dir.iterdir()) if stage_dir.is_dir() else []
    assert not [n for n in leftovers if n.startswith(("broken-", ".tmp-"))], leftovers
    assert not [a for a in list_artifacts(runs) if a.stage == "rl"]
    with pytest.raises(UserError, match="rl"):
        resolve("rl:latest", "rl", runs)

    ref = run_stage("rl", None, [*TINY_RL, "name=broken"], runs)
    assert ref.path.name.startswith("broken-") and (ref.path / "manifest.json").is_file()
    assert (ref.path / "reward_curves.png").read_bytes()[:4] == b"\x89PNG"
    model, _ = load_policy(ref.path)
    assert not (stage_dir / f".work-{ref.id}").exists()  # the work dir goes once the artifact is out
    assert [a.path for a in list_artifacts(runs) if a.stage == "rl"] == [ref.path]
    assert resolve("rl:latest", "rl", runs).path == ref.path
    assert torch.isfinite(next(model.parameters())).all()
