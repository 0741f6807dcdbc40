"""Paired comparisons between an experiment's rows (r3rag.experiments.results.compare): per-question EM
averaged over seeds, the difference bootstrapped over the same questions, bad pairs one error."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from r3rag.experiments.results.compare import (
    build_comparisons,
    claims_markdown,
    compare_claims,
    compare_spec,
    comparison_markdown,
    verdict,
)
from r3rag.util.errors import UserError

TABLE = {"GRPO": ["g#s0/rl", "g#s1/rl"], "SFT": ["g#s0/sft", "g#s1/sft"], "same": "h/sft"}


def _eval(tmp_path: Path, name: str, systems: dict[str, list[float]]):
    d = tmp_path / name
    d.mkdir()
    rows = [{"system": s, "id": f"q{i}", "em": em} for s, ems in systems.items() for i, em in enumerate(ems)]
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"eval": SimpleNamespace(path=d)}


def test_a_clear_gain_is_outside_the_noise_and_equal_arms_inside(tmp_path):
    n = 200
    built = {
        "g#s0": _eval(tmp_path, "s0", {"rl": [1.0] * 150 + [0.0] * 50, "sft": [1.0] * 60 + [0.0] * 140}),
        "g#s1": _eval(tmp_path, "s1", {"rl": [1.0] * 140 + [0.0] * 60, "sft": [1.0] * 60 + [0.0] * 140}),
        "h": _eval(tmp_path, "h", {"sft": [1.0] * 60 + [0.0] * 140}),
    }
    gain, same = build_comparisons([("GRPO", "SFT"), ("same", "SFT")], TABLE, built)
    assert gain["diff"] == pytest.approx((145 - 60) / n) and gain["ci"][0] > 0 and not gain["inside_noise"]
    assert gain["n"] == n and gain["n_seeds"] == [2, 2]
    assert same["diff"] == 0 and same["inside_noise"]
    assert gain["per_seed"] == {"s0": 0.45, "s1": 0.4} and same["per_seed"] is None  # "h" is not seeded
    text = comparison_markdown([gain, same])
    assert "| GRPO | SFT | +0.425 [" in text and text.count("| does not stand: inside the noise |") == 1
    assert (
        "| 200 | 2/2 | stands | +0.450 / +0.400 |" in text
        and "| 200 | 1/2 | does not stand: inside the noise | - |" in text
    )
    assert "a - b per seed" not in comparison_markdown([same])  # no column where no pair is seeded


def test_per_seed_differences_pair_the_same_seed_and_skip_a_seed_one_arm_lacks(tmp_path):
    built = {
        "g#s0": _eval(tmp_path, "s0", {"rl": [1.0, 1.0], "sft": [0.0, 0.0]}),
        "g#s2": _eval(tmp_path, "s2", {"rl": [1.0, 0.0], "sft": [1.0, 1.0]}),
    }
    table = {"GRPO": ["g#s0/rl", "g#s2/rl"], "SFT": ["g#s2/sft"]}  # SFT's seed 0 not finished
    (c,) = build_comparisons([("GRPO", "SFT")], table, built)
    assert c["per_seed"] == {"s2": -0.5} and c["n_seeds"] == [2, 1]


def test_arms_over_different_questions_are_one_clear_error(tmp_path):
    built = {"g#s0": _eval(tmp_path, "s0", {"rl": [1.0, 0.0]}), "h": _eval(tmp_path, "h", {"sft": [1.0, 0.0, 1.0]})}
    with pytest.raises(UserError, match=r"compare \[a, b\]: .*different questions"):
        build_comparisons([("a", "b")], {"a": "g#s0/rl", "b": "h/sft"}, built)


@pytest.mark.parametrize(
    "compare, message",
    [
        ({"GRPO": "SFT"}, "expected a list"),
        ([["GRPO"]], r"compare\[0\]: expected \[row a, row b\]"),
        ([{"a": "GRPO", "claim": "x"}], r"compare\[0\]: expected \[row a, row b\] or \{a: "),
        ([{"a": "GRPO", "b": "SFT", "claims": "x"}], r"compare\[0\]: expected"),  # a misspelt key is not dropped
        ([["GRPO", "SFT"], ["GRPO", "nope"]], r"compare\[1\]: 'nope' is not a row of table"),
    ],
)
def test_bad_compare_sections_name_the_pair(compare, message):
    with pytest.raises(UserError, match=message):
        compare_spec(Path("exp.yaml"), {"table": TABLE, "compare": compare})
    assert compare_spec(Path("exp.yaml"), {"table": TABLE}) == []


def _comparison(diff, ci, per_seed=None, claim=None):
    return {
        "a": "GRPO",
        "b": "SFT",
        "claim": claim,
        "diff": diff,
        "ci": list(ci),
        "n": 500,
        "n_seeds": [3, 3],
        "per_seed": per_seed,
    }


@pytest.mark.parametrize(
    "ci, per_seed, expected",
    [
        ((0.01, 0.05), {"s0": 0.02, "s1": 0.03, "s2": 0.04}, "stands"),
        ((0.01, 0.05), {"s0": 0.06, "s1": 0.03, "s2": -0.01}, "stands, not at every seed"),
        ((-0.01, 0.05), None, "does not stand: inside the noise"),
        ((-0.05, -0.01), None, "does not stand: b is better"),
    ],
)
def test_a_claim_stands_only_where_its_interval_lies_above_zero(ci, per_seed, expected):
    assert verdict(_comparison(0.03, ci, per_seed)) == expected


def test_claims_in_words_come_from_the_compare_section_and_read_as_sentences():
    compare = [{"a": "GRPO", "b": "SFT", "claim": "GRPO beats its cold start"}, ["same", "SFT"]]
    data = {"table": TABLE, "compare": compare}
    assert compare_spec(Path("exp.yaml"), data) == [("GRPO", "SFT"), ("same", "SFT")]
    assert compare_claims(Path("exp.yaml"), data) == {("GRPO", "SFT"): "GRPO beats its cold start"}
    worse = _comparison(-0.028, (-0.052, -0.004), {"s0": -0.028, "s1": -0.01, "s2": -0.04}, "GRPO beats its cold start")
    text = claims_markdown([worse, {**_comparison(0.0, (-0.02, 0.02)), "n_seeds": [1, 1], "claim": None}])
    assert text.splitlines() == [
        "- **GRPO beats its cold start**: does not stand: the other arm is better; EM -0.028 [-0.052, -0.004] "
        "over 500 questions, 3 seeds (per seed -0.028 / -0.010 / -0.040).",
        "- **GRPO beats SFT**: does not stand: inside the noise; EM +0.000 [-0.020, +0.020] over 500 questions, 1 seed.",
    ]


def test_built_comparisons_carry_the_claim_or_say_a_beats_b(tmp_path):
    built = {"h": _eval(tmp_path, "h", {"sft": [1.0, 0.0], "rl": [1.0, 1.0]})}
    table = {"RL": "h/rl", "SFT": "h/sft"}
    (stated,) = build_comparisons([("RL", "SFT")], table, built, claims={("RL", "SFT"): "RL helps"})
    (plain,) = build_comparisons([("RL", "SFT")], table, built)
    assert stated["claim"] == "RL helps" and plain["claim"] == "RL beats SFT"
