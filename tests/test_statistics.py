"""Intervals and seeds (r3rag.core.metrics): Clopper-Pearson for proportions, one seeded bootstrap for
everything else, mean ± sd over seeds, paired comparisons, and the results table's seed rows."""

import json
import math
from types import SimpleNamespace

import pytest

from r3rag.core.metrics import (
    bootstrap_ci,
    clopper_pearson,
    mean_ci,
    over_seeds,
    paired_bootstrap_diff,
    paired_over_seeds,
)


def _binom_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_clopper_pearson_known_values():
    assert clopper_pearson(0, 400) == (0.0, round(1 - 0.025 ** (1 / 400), 4)) == (0.0, 0.0092)
    assert clopper_pearson(400, 400) == (round(0.025 ** (1 / 400), 4), 1.0)
    assert clopper_pearson(5, 10) == (0.1871, 0.8129)  # the textbook 95% interval of 5/10
    assert clopper_pearson(0, 0) == (0.0, 0.0)


@pytest.mark.parametrize("k, n", [(1, 20), (7, 30), (29, 30)])
def test_clopper_pearson_bounds_are_the_exact_binomial_tails(k, n):
    lo, hi = clopper_pearson(k, n)
    assert _binom_cdf(k, n, hi) == pytest.approx(0.025, abs=2e-3)  # P(X <= k | hi) = alpha/2
    assert 1 - _binom_cdf(k - 1, n, lo) == pytest.approx(0.025, abs=2e-3)  # P(X >= k | lo) = alpha/2
    assert clopper_pearson(n - k, n) == (round(1 - hi, 4), round(1 - lo, 4))  # symmetric


def test_mean_ci_is_exact_for_0_1_scores_and_bootstrap_otherwise():
    assert mean_ci([0.0] * 400) == (0.0, 0.0092)  # not the bootstrap's [0, 0]
    assert bootstrap_ci([0.0] * 400) == (0.0, 0.0)
    assert mean_ci([1, 0] * 5) == clopper_pearson(5, 10)
    f1 = [0.5, 0.0, 1.0, 0.25] * 25
    assert mean_ci(f1) == bootstrap_ci(f1)
    assert mean_ci([]) == (0.0, 0.0)


def test_bootstrap_is_seeded_and_paired_diff_resamples_the_differences():
    values = [(i * 0.37) % 1 for i in range(100)]
    assert bootstrap_ci(values) == bootstrap_ci(values)  # same seed, same interval
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values, seed=2)
    a, b = [1.0, 0.0, 1.0, 1.0] * 50, [0.0, 0.0, 1.0, 0.0] * 50
    diff, ci = paired_bootstrap_diff(a, b)
    assert diff == 0.5 and ci == bootstrap_ci([x - y for x, y in zip(a, b)])
    assert ci[0] < 0.5 < ci[1]
    with pytest.raises(ValueError, match="share questions"):
        paired_bootstrap_diff([1.0], [1.0, 0.0])


def test_bootstrap_chunks_many_questions_without_changing_the_answer():
    values = [float(i % 3 == 0) * 0.5 for i in range(3000)]  # 3000 x 2000 resamples: chunked
    lo, hi = bootstrap_ci(values)
    assert lo < sum(values) / len(values) < hi and hi - lo < 0.03


def test_over_seeds_mean_sd_and_interval_over_questions():
    seeds = [
        {"q1": 1.0, "q2": 0.0, "q3": 1.0, "q4": 0.0},
        {"q1": 1.0, "q2": 1.0, "q3": 1.0, "q4": 0.0},
        {"q1": 0.0, "q2": 0.0, "q3": 1.0, "q4": 0.0},
    ]
    out = over_seeds(seeds)
    assert out["per_seed"] == [0.5, 0.75, 0.25] and out["mean"] == 0.5
    assert out["sd"] == 0.25  # ddof=1: sqrt(((0)^2 + 0.25^2 + 0.25^2) / 2)
    assert out["n_seeds"] == 3 and out["n"] == 4
    assert out["ci"] == bootstrap_ci([2 / 3, 1 / 3, 1.0, 0.0])  # seed-averaged scores are not 0/1
    one = over_seeds(seeds[:1])
    assert one["sd"] is None and one["ci"] == clopper_pearson(2, 4)
    with pytest.raises(ValueError, match="share questions"):
        over_seeds([{"q1": 1.0}, {"q2": 1.0}])


def test_paired_over_seeds_compares_seed_averaged_questions():
    a = [{f"q{i}": float(i % 2) for i in range(100)}, {f"q{i}": 1.0 for i in range(100)}]
    b = [{f"q{i}": 0.0 for i in range(100)}]
    out = paired_over_seeds(a, b)
    assert out["diff"] == 0.75 and out["n"] == 100 and out["n_seeds"] == (2, 1)
    assert out["ci"][0] > 0.6 and not out["inside_noise"]
    assert paired_over_seeds(a, a)["inside_noise"]
    with pytest.raises(ValueError, match="different questions"):
        paired_over_seeds(a, [{"x": 1.0}])


def _eval_dir(tmp_path, name: str, em: dict[str, float]):
    """A fake eval artifact: metrics.json and predictions.jsonl of one system "rl"."""
    d = tmp_path / name
    d.mkdir()
    mean = sum(em.values()) / len(em)
    (d / "metrics.json").write_text(
        json.dumps(
            {
                "systems": {
                    "rl": {
                        "em": mean,
                        "em_ci": list(mean_ci(list(em.values()))),
                        "f1": mean,
                        "n": len(em),
                        "searches": 1.0,
                        "by_hops": {"2": {"em": mean}},
                        "seconds": 10.0,
                    }
                }
            }
        )
    )
    (d / "predictions.jsonl").write_text(
        "".join(json.dumps({"system": "rl", "id": q, "em": v}) + "\n" for q, v in em.items())
    )
    return {"eval": SimpleNamespace(path=d, manifest={}), "rl": SimpleNamespace(manifest={"id": name, "seconds": 60.0})}


def test_results_table_rows_over_seeds(tmp_path):
    from r3rag.experiments.results.table import build_rows, markdown

    built = {
        "s1": _eval_dir(tmp_path, "s1", {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}),
        "s2": _eval_dir(tmp_path, "s2", {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}),
        "s3": _eval_dir(tmp_path, "s3", {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}),
    }
    rows = build_rows({"one seed": "s1/rl", "three seeds": ["s1/rl", "s2/rl", "s3/rl"]}, built, tmp_path / "x.yaml")
    single, seeded = rows
    assert single["em"] == 0.5 and "em_sd" not in single
    assert seeded["em"] == 0.5 and seeded["em_sd"] == 0.25 and seeded["n_seeds"] == 3 and seeded["n"] == 4
    assert seeded["em_ci"] == list(
        over_seeds(
            [
                {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0},
                {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0},
                {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0},
            ]
        )["ci"]
    )
    assert seeded["train_seconds"] == 60.0 and seeded["by_hops"] == {"2": 0.5}
    about = {"date": "d", "machine": "m", "wall_seconds": 60.0, "compute_seconds": 60.0}
    md = markdown(rows, about)
    assert md.splitlines()[0].startswith("|  | EM [95% CI]") and md.splitlines()[0].endswith("| EM per seed |")
    assert "| three seeds | 0.500 ± 0.250 [" in md and "mean ± sd over seeds" in md and "Clopper-Pearson" in md
    assert md.splitlines()[3].endswith("| 0.500 / 0.750 / 0.250 |") and md.splitlines()[2].endswith("| - |")
    assert "seeds" not in markdown(rows[:1], about).splitlines()[0]  # no seeds column without seeds


def test_the_chart_draws_each_seeds_em_as_a_dot_on_its_row():
    plt = pytest.importorskip("matplotlib.pyplot", reason="the chart needs the [plots] extra")
    from r3rag.experiments.results.table import chart

    rows = [
        {"label": "GRPO", "em": 0.75, "em_ci": [0.71, 0.79], "em_per_seed": [0.754, 0.72, 0.776]},
        {"label": "SFT", "em": 0.7, "em_ci": [0.66, 0.74]},
    ]
    fig = chart(rows, plt)
    ax = fig.axes[0]
    dots = [line for line in ax.lines if line.get_marker() == "o"]
    assert [list(d.get_xdata()) for d in dots] == [[0.754, 0.72, 0.776], []]  # the first row (top) has seeds
    assert "each seed" in ax.get_xlabel() and "each seed" not in chart(rows[1:], plt).axes[0].get_xlabel()
    plt.close("all")
