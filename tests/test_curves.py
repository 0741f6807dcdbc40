"""Training curves across runs (issue 46's stability measure): drops below a run's own best,
against hand computations, and one chart of every arm and seed."""

import json

import pytest

from r3rag.training.curves import largest_drop, plot_curves, run_curve, smoothed, stability


def test_the_largest_drop_is_the_deepest_fall_below_the_best_so_far():
    assert largest_drop([0.1, 0.5, 0.3, 0.6, 0.2, 0.4]) == pytest.approx(0.4)  # 0.6 -> 0.2
    assert largest_drop([0.1, 0.2, 0.3]) == 0.0  # never fell
    assert largest_drop([]) == 0.0
    assert smoothed([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    # one bad step inside a window of 3 moves the average by a third of its fall
    assert largest_drop([0.9, 0.9, 0.9, 0.0, 0.9, 0.9], 3) == pytest.approx(0.3)


def test_stability_reads_both_curves_of_every_run(tmp_path):
    rows = [
        {"step": s, "reward": r, **({"dev_em": d} if d is not None else {})}
        for s, r, d in [(1, 0.2, 0.50), (2, 0.4, None), (3, 0.1, 0.40), (4, 0.5, 0.55)]
    ]
    out = stability({"PPO": {"0": rows}})["PPO"]["0"]
    assert out["dev_em_drop"] == pytest.approx(0.1) and out["best_dev_em"] == 0.55 and out["last_dev_em"] == 0.55
    # averaged over up to 10 steps: 0.2, 0.3, 0.233, 0.3; the fall is 0.3 -> 0.233
    assert out["reward_drop"] == pytest.approx(0.3 - 0.7 / 3, abs=1e-4)
    png = tmp_path / "curves.png"
    if plot_curves({"PPO": {"0": rows}, "GRPO": {"0": rows}}, png, title="t"):
        assert png.read_bytes()[:4] == b"\x89PNG"


def _rl_artifact(root, name, steps, policy, metrics=None, dev=None):
    """An RL artifact's directory as run_curve reads it: manifest.json (its policy input and
    metrics) and metrics.jsonl (reward per step, `dev/em` on the steps in `dev`)."""
    path = root / "rl" / name
    path.mkdir(parents=True)
    lines = [{"step": s, "reward": s / 10, **({"dev/em": dev[s]} if s in (dev or {}) else {})} for s in steps]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    manifest = {"stage": "rl", "content_hash": "-", "inputs": {"policy": {"id": policy[1], "stage": policy[0]}}}
    manifest["metrics"] = metrics or {}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_a_run_started_from_another_runs_policy_continues_its_curve(tmp_path):
    _rl_artifact(tmp_path, "first", [1, 2, 3], ("sft", "cold"), {"kept_step": 3})
    second = _rl_artifact(tmp_path, "second", [1, 2], ("rl", "first"), {"kept_step": 2, "start_dev_em": 0.3}, {2: 0.4})
    third = _rl_artifact(tmp_path, "third", [1], ("rl", "second"), {"kept_step": 1, "start_dev_em": 0.9})
    # the first link's curve as it is; the second's start (its dev EM before its first step) is step 3's
    assert run_curve(tmp_path / "rl" / "first") == [{"step": s, "reward": s / 10} for s in (1, 2, 3)]
    assert [(r["step"], r["reward"], r.get("dev_em")) for r in run_curve(third)] == [
        (1, 0.1, None),
        (2, 0.2, None),
        (3, 0.3, 0.3),
        (4, 0.1, None),
        (5, 0.2, 0.4),  # evaluated there: the third's start EM does not replace it
        (6, 0.1, None),
    ]
    assert run_curve(second)[-1] == {"step": 5, "reward": 0.2, "dev_em": 0.4}


def test_a_run_started_from_an_earlier_runs_best_step_continues_from_that_step(tmp_path):
    _rl_artifact(tmp_path, "first", [1, 2, 3, 4], ("sft", "cold"), {"kept_step": 2}, {2: 0.5, 4: 0.2})
    second = _rl_artifact(tmp_path, "second", [1, 2], ("rl", "first"), {"start_dev_em": 0.5})
    assert [(r["step"], r.get("dev_em")) for r in run_curve(second)] == [(1, None), (2, 0.5), (3, None), (4, None)]


def _eval_artifact(root, name, rl_id, split, em, n):
    path = root / "eval" / name
    path.mkdir(parents=True)
    manifest = {"stage": "eval", "content_hash": "-", "config": {"split": split}}
    manifest["inputs"] = {"rl": {"id": rl_id, "stage": "rl"}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "metrics.json").write_text(json.dumps({"systems": {"rl": {"em": em, "n": n}}}))


def test_a_links_dev_em_comes_from_the_dev_eval_of_its_published_policy(tmp_path):
    """Links of a long run each scored by the eval stage on dev (not in training): each link's
    last step carries its eval's EM; a test-split eval and a smaller dev eval do not count."""
    _rl_artifact(tmp_path, "first", [1, 2], ("sft", "cold"), {"kept_step": 2})
    second = _rl_artifact(tmp_path, "second", [1, 2], ("rl", "first"), {"kept_step": 2})
    _eval_artifact(tmp_path, "e1", "first", "dev", 0.25, 80)
    _eval_artifact(tmp_path, "e2", "first", "dev", 0.9, 10)  # fewer questions
    _eval_artifact(tmp_path, "e3", "second", "test", 0.7, 300)  # not dev
    _eval_artifact(tmp_path, "e4", "second", "dev", 0.375, 80)
    assert [(r["step"], r.get("dev_em")) for r in run_curve(second)] == [(1, None), (2, 0.25), (3, None), (4, 0.375)]
