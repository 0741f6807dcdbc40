"""`rl` evaluates on dev during training (issue 17): dev EM and F1 logged beside the reward at the
eval steps, `keep=best_dev` publishing the best step's weights, one line without a dev split, and a
killed run with these settings and dynamic sampling resuming to where a straight run ends."""

import json

import pytest
import torch

from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.test_rl_correctness import searching_policy  # noqa: F401 (a fixture: an SFT policy that searches)


def _dev_file(world, tmp_path, n=4):
    """The first `n` test questions of the world artifact at `world`, as a dev file. (The world by
    path, not the runs dir's only one: the session's pipeline_runs may hold others that tests of
    other files built, and which ran first depends on the order pytest's workers take the files.)"""
    from r3rag.util.jsonl import read_jsonl

    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in read_jsonl(world / "test.jsonl")[:n]))
    return path


def test_dev_em_is_logged_beside_the_reward_at_the_eval_steps(pipeline_runs, tmp_path):
    """A real greedy dev evaluation every 2 steps and at the last (3), with dynamic sampling and
    per-step credit on: dev/em and dev/f1 in those steps' metrics lines, the kept step in the manifest."""
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl

    runs, refs = pipeline_runs
    ref = run_stage(
        "rl",
        None,
        [
            "name=dev",
            "steps=3",
            "prompts_per_step=2",
            "num_generations=2",
            "bf16=false",
            "max_turns=2",
            "max_new_tokens=12",
            "eval_every=2",
            f"eval_questions={_dev_file(refs['world'].path, tmp_path)}",
            "dynamic_sampling=true",
            "dynamic_sampling_rounds=1",
            "process_credit=step",
            "rewards={em: 1.0, relevance: 0.5}",
        ],
        runs,
    )
    rows = read_jsonl(ref.path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert ["dev/em" in r for r in rows] == [False, True, True]
    for r in rows[1:]:
        assert 0 <= r["dev/em"] <= 1 and 0 <= r["dev/f1"] <= 1 and "reward" in r and r["time/dev_eval"] > 0
    assert "rollout/dropped_groups" in rows[0] and "rewards/relevance/mean" in rows[0]
    m = ref.manifest["metrics"]
    assert m["kept_step"] == 3 and m["kept_dev_em"] == rows[-1]["dev/em"] and 0 <= m["start_dev_em"] <= 1


def test_keep_best_dev_publishes_the_best_steps_weights(pipeline_runs, tmp_path, monkeypatch):
    """Dev EM scripted per step (0.1 before training, 0.5 at step 2, 0.2 at step 4): the artifact
    holds the weights the policy had at step 2, not the last ones (weight decay moves them every step)."""
    from safetensors.torch import load_file

    from r3rag.experiments.pipeline import run_stage
    from r3rag.rl import grpo
    from r3rag.util.jsonl import read_jsonl

    runs, refs = pipeline_runs
    script = {0: 0.1, 2: 0.5, 4: 0.2}
    weights = {}

    def scripted(trainer, questions, *a):
        step = trainer.state.global_step
        weights[step] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        return {"dev/em": script[step], "dev/f1": script[step]}

    monkeypatch.setattr(grpo, "dev_scores", scripted)
    ref = run_stage(
        "rl",
        None,
        [
            "name=best",
            "steps=4",
            "prompts_per_step=2",
            "num_generations=2",
            "bf16=false",
            "max_turns=2",
            "max_new_tokens=12",
            "eval_every=2",
            "keep=best_dev",
            "weight_decay=0.5",
            "lr=1e-2",
            f"eval_questions={_dev_file(refs['world'].path, tmp_path)}",
        ],
        runs,
    )
    rows = read_jsonl(ref.path / "metrics.jsonl")
    assert {r["step"]: r.get("dev/em") for r in rows} == {1: None, 2: 0.5, 3: None, 4: 0.2}
    m = ref.manifest["metrics"]
    assert (m["kept_step"], m["kept_dev_em"], m["start_dev_em"], m["best_dev_step"]) == (2, 0.5, 0.1, 2)
    published = load_file(ref.path / "model" / "model.safetensors")
    shared = [k for k in published if k in weights[2]]
    assert shared
    for k in shared:
        torch.testing.assert_close(published[k], weights[2][k], msg=k)
    assert any(not torch.equal(published[k], weights[4][k]) for k in shared)  # not the last step's


def test_dev_eval_without_a_dev_split_is_one_line(pipeline_runs, tmp_path):
    runs, refs = pipeline_runs
    questions = _dev_file(refs["world"].path, tmp_path)
    out = r3rag_inprocess("rl", "--runs-dir", str(runs), "--set", "eval_every=2", "--set", f"questions={questions}")
    assert_one_line_error(out, "rl.eval_every", "set rl.eval_questions")
    out = r3rag_inprocess("rl", "--runs-dir", str(runs), "--set", "keep=best_dev")
    assert_one_line_error(out, "rl.keep=best_dev")


@pytest.mark.slow  # two GRPO runs with dev evals, one killed and resumed: ~13 s (2 AVX2 cores)
def test_a_resumed_run_with_the_new_settings_ends_where_a_straight_run_ends(searching_policy, tmp_path, monkeypatch):
    """Dynamic sampling (refills drawn from a seeded generator; with this weak policy and
    reward some groups are flat every step) and best-on-dev, with a kill right after
    checkpoint-3: the same per-step rewards, losses, refills and dev EM, the same kept step and
    the same published weights as a straight run."""
    from safetensors.torch import load_file

    from r3rag.util.jsonl import read_jsonl
    from tests.test_rl_correctness import _kill_after_checkpoint, _Killed, _run_rl

    extra = [
        "eval_every=2",
        "keep=best_dev",
        f"eval_questions={_dev_file(next((searching_policy / 'world').glob('default-*')), tmp_path, n=8)}",
        "dynamic_sampling=true",
        "dynamic_sampling_rounds=2",
        "epsilon_high=0.28",
        "rewards={em: 1.0, format: 0.5}",
    ]
    straight = _run_rl(searching_policy, "straight-new", *extra)
    with monkeypatch.context() as m:
        _kill_after_checkpoint(m, 3)
        with pytest.raises(_Killed):
            _run_rl(searching_policy, "resumed-new", *extra)
    resumed = _run_rl(searching_policy, "resumed-new", *extra, "resume=true")
    a_rows, b_rows = (read_jsonl(ref.path / "metrics.jsonl") for ref in (straight, resumed))
    assert [r["step"] for r in b_rows] == [1, 2, 3, 4]
    assert sum(r["rollout/dropped_groups"] for r in a_rows) > 0 and any(r["loss"] != 0 for r in a_rows)
    for k in ("reward", "loss", "rewards/format/mean", "rollout/dropped_groups", "rollout/refill_rounds"):
        assert [r[k] for r in b_rows] == pytest.approx([r[k] for r in a_rows], rel=1e-5, abs=1e-7), k
    assert [r.get("dev/em") for r in b_rows] == [r.get("dev/em") for r in a_rows]
    keys = ("kept_step", "kept_dev_em", "start_dev_em", "best_dev_step")
    assert [resumed.manifest["metrics"][k] for k in keys] == [straight.manifest["metrics"][k] for k in keys]
    a, b = (load_file(ref.path / "model" / "model.safetensors") for ref in (straight, resumed))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
