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


def test_the_eval_stages_table_never_cuts_a_header_or_a_number_in_80_columns():
    """The table `r3rag eval` prints: in an 80-column terminal (a CI log) the columns that do not
    fit are left out and named under it, never cut to "search…" or "0.0…"; a wide one shows all."""
    import io

    from rich.console import Console

    from r3rag.evaluation.predictions import print_table

    hops = {"2": {"em": 1.0}, "3": {"em": 0.987}, "4": {"em": 0.5}}
    row = {"em": 0.987, "f1": 0.991, "n": 400, "searches": 2.37, "tokens": 41.0, "questions_per_s": 1075.3}
    metrics = {"dataset": "world", "systems": {s: {**row, "by_hops": hops} for s in ("direct", "rag", "sft", "rl")}}
    out = io.StringIO()
    print_table(metrics, Console(file=out, width=80))
    text = out.getvalue()
    assert "…" not in text and "0.987" in text and "searches" in text and "1075.3" not in text
    assert "left out for the terminal's width: q/s, tokens" in " ".join(text.split())
    wide = io.StringIO()
    print_table(metrics, Console(file=wide, width=160))
    assert "1075.3" in wide.getvalue() and "left out" not in wide.getvalue()
