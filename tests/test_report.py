"""`r3rag report`: table files, bar chart and a self-contained HTML viewer over eval artifacts."""

import csv
import json

from r3rag.experiments.pipeline import run_stage


def test_report_over_an_eval_artifact(pipeline_runs):
    runs, refs = pipeline_runs
    ref = run_stage("report", None, [f"evals=[{refs['eval'].path}]", "name=t"], runs)
    md = (ref.path / "report.md").read_text()
    for system in ("direct", "rag", "sft", "rl"):
        assert f"| {system} |" in md
    rows = list(csv.DictReader(open(ref.path / "report.csv")))
    assert {r["system"] for r in rows} == {"direct", "rag", "sft", "rl"} and all(r["n"] == "12" for r in rows)
    png = (ref.path / "em_f1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    page = (ref.path / "viewer.html").read_text()
    assert "<script src" not in page and "<link" not in page  # self-contained
    data = json.loads(page.split("const DATA = ", 1)[1].split(";\n", 1)[0])
    assert len(data) == 4 * 12
    rag = [r for r in data if r["system"] == "rag"]
    assert all(len(r["retrieved_docs"]) == 1 and r["gold_docs"] for r in rag)
    assert ref.manifest["metrics"]["viewer_trajectories"] == 48


def test_eval_reports_bootstrap_intervals(pipeline_runs):
    _, refs = pipeline_runs
    metrics = json.loads((refs["eval"].path / "metrics.json").read_text())
    for m in metrics["systems"].values():
        lo, hi = m["em_ci"]
        assert lo <= m["em"] <= hi


def test_viewer_data_groups_questions_across_evals(tmp_path):
    """Rows without a data set take their eval's; a system in two evals gets a column per eval;
    the cap keeps whole questions (every system's row for the first N questions of each eval)."""
    from r3rag.evaluation.report import write_viewer

    dirs = []
    for name in ("eval-a", "eval-b"):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"systems": {}, "dataset": "world-1:test"}))
        systems = ("sft", "rl" if name == "eval-a" else "base")
        rows = [{"system": s, "id": f"q{i}", "question": f"Q{i} ?", "em": 1.0} for s in systems for i in range(3)]
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        dirs.append(d)
    page = tmp_path / "viewer.html"
    assert write_viewer(dirs, page, max_per_system=2) == 8
    data = json.loads(page.read_text().split("const DATA = ", 1)[1].split(";\n", 1)[0])
    # the page counts against the evals' 3 questions, not the 2 it kept ("2 of 3 questions shown")
    assert "const TOTAL = 3;" in page.read_text() and "${shown.length} of ${TOTAL} questions shown" in page.read_text()
    assert {r["dataset"] for r in data} == {"world-1:test"}
    assert {r["id"] for r in data} == {"q0", "q1"}
    assert {r["column"] for r in data} == {"sft (eval-a)", "sft (eval-b)", "rl", "base"}


def test_terminal_table_leaves_columns_out_rather_than_cut_numbers():
    """An 80-column terminal gets whole numbers and a caption naming the columns left out;
    a wide one gets every column, intervals included."""
    from rich.console import Console

    from r3rag.evaluation.report import rich_table

    ci = {"em_ci": [0.345, 0.48], "f1_ci": [0.433, 0.567]}
    rows = [
        {"dataset": "world-demo:test", "system": s, "em": 0.412, "f1": 0.5012, "n": 200, **ci}
        | {"searches": 1.93, "gold_doc_recall": 0.612, "judge_acc": None, "tokens": None}
        for s in ("direct", "rag", "sft", "rl")
    ]
    console = Console(width=80, record=True)
    console.print(rich_table(rows, 80))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    assert "world-demo:test" in text and "0.412" in text and "0.501" in text and "[0.345" not in text
    assert "left out for the terminal's width: em_ci, f1_ci" in " ".join(text.split())

    wide = Console(width=200, record=True)
    wide.print(rich_table(rows, 200))
    text = wide.export_text()
    assert "[0.345, 0.480]" in text and "[0.433, 0.567]" in text and "left out" not in text
