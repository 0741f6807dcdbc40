"""`r3rag report`: table files, bar chart and a self-contained HTML viewer over eval artifacts."""

import csv
import json

from r3rag.pipeline import run_stage


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
