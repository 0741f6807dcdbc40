"""The eval's tables: scores per data set and paired comparisons between systems."""

from r3rag.core.metrics import paired_bootstrap_diff
from r3rag.evaluation.tables import comparison_table, dataset_table, paired_comparisons


def test_paired_comparisons_use_the_shared_paired_bootstrap():
    rows = [
        {"system": s, "id": f"q{i:02d}", "em": float(v)}
        for i in range(60)
        for s, v in (("sft", i % 3 == 0), ("rl", i % 3 != 2), ("same", i % 3 == 0))
    ]
    comps = {(c["system"], c["reference"]): c for c in paired_comparisons(rows, references=["sft"])}
    rl = comps[("rl", "sft")]
    diff, ci = paired_bootstrap_diff([float(i % 3 != 2) for i in range(60)], [float(i % 3 == 0) for i in range(60)])
    assert rl["n"] == 60 and rl["em_diff"] == diff and rl["em_diff_ci"] == list(ci) and not rl["inside_noise"]
    assert comps[("same", "sft")]["inside_noise"]
    md = comparison_table(list(comps.values()))
    assert "| rl | sft | 60 | +0.333" in md and "inside the noise" in md


def test_dataset_table_shows_each_interval():
    systems = {
        "rl": {
            "em": 0.0,
            "em_ci": (0.0, 0.0092),
            "f1": 0.1,
            "f1_ci": (0.05, 0.15),
            "cover": 0.0,
            "cover_ci": (0.0, 0.0092),
            "n": 400,
            "by_dataset": {},
        }
    }
    assert "| rl | all | 400 | 0.000 [0.000, 0.009] | 0.100 [0.050, 0.150] |" in dataset_table(systems)
