"""Training curves across runs (issue 46's stability measure): drops below a run's own best,
against hand computations, and one chart of every arm and seed."""

import pytest

from r3rag.training.curves import largest_drop, plot_curves, smoothed, stability


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
