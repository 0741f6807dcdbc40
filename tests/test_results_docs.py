"""Every figure in the docs comes from a results file: the committed docs' generated blocks equal
what their committed results files give (r3rag.experiments.results.docs), and the results file an experiment
writes (r3rag.experiments.results.file) holds every run behind each row."""

import json
from pathlib import Path

import pytest
import yaml

from r3rag.experiments.results.docs import CLOSE, doc_files, regenerate, stale, update_docs
from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import TINY_WORLD

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("doc", doc_files(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_docs_match_their_results_files(doc):
    """README.md, docs/*.md and benchmarks/RESULTS.md: a block edited by hand, or a results file
    changed without `r3rag report --results`, fails here with the diff. (A file without markers
    has nothing generated and passes.)"""
    diff = stale(doc, ROOT)
    assert not diff, f"run `r3rag report --results <file>` (or undo the hand edit):\n{diff}"


def test_the_check_reads_the_docs_it_should():
    names = {str(p.relative_to(ROOT)) for p in doc_files(ROOT)}
    assert {"README.md", "docs/replication.md", "benchmarks/RESULTS.md"} <= names


def _row(label: str, em: float, **extra) -> dict:
    return {
        "label": label,
        "source": extra.pop("source", f"v/{label}"),
        "em": em,
        "em_ci": [max(em - 0.05, 0.0), min(em + 0.05, 1.0)],
        "f1": em,
        "n": 400,
        "searches": 2.5,
        "by_hops": {"2": em, "3": em},
        "train_seconds": 600.0,
        "eval_seconds": 30.0,
        "runs": [],
        **extra,
    }


def _results(tmp_path: Path) -> Path:
    results = {
        "schema": 1,
        "experiment": "fab",
        "date": "2026-12-01",
        "machine": "x86_64, 2 cores, no GPU, torch 2",
        "wall_seconds": 60.0,
        "compute_seconds": 120.0,
        "table_artifact": "fab-1",
        "tables": {"all": ["SFT", "GRPO", "GRPO, 3 seeds"], "headline": ["GRPO", "SFT"]},
        "rows": [
            _row("SFT", 0.372),
            _row("GRPO", 0.733),
            _row("GRPO, 3 seeds", 0.5, em_sd=0.2, n_seeds=3, source=["a/rl", "b/rl", "c/rl"]),
        ],
    }
    path = tmp_path / "results" / "fab.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results))
    return path


README = """# A project

Hand-written text stays.

<!-- r3rag:results results/fab.json headline chart=docs/fab.png -->
stale text
<!-- /r3rag:results -->

More text.

<!-- r3rag:results results/fab.json all -->
<!-- /r3rag:results -->
"""


def test_report_regenerates_only_between_markers_and_a_hand_edit_fails_the_check(tmp_path):
    _results(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    written, found = update_docs([readme], tmp_path, [Path("results/fab.json")])
    assert found == 2 and written == [readme, tmp_path / "docs" / "fab.png"]
    assert (tmp_path / "docs" / "fab.png").read_bytes()[:8] == PNG
    text = readme.read_text()
    outside = text.split("<!-- r3rag")[0] + text.split(CLOSE)[1].split("<!-- r3rag")[0]
    assert outside == README.split("<!-- r3rag")[0] + README.split(CLOSE)[1].split("<!-- r3rag")[0]
    head = text.split(CLOSE)[0]
    assert "stale text" not in head and head.index("| GRPO |") < head.index("| SFT |")  # the named table's order
    assert "GRPO, 3 seeds" not in head and "| GRPO, 3 seeds | 0.500 ± 0.200" in text
    assert "0.733 [0.683, 0.783]" in head and "2026-12-01" in head
    assert stale(readme, tmp_path) == ""
    assert update_docs([readme], tmp_path)[0] == [tmp_path / "docs" / "fab.png"]  # unchanged text: not rewritten

    readme.write_text(text.replace("0.733 [0.683", "0.800 [0.683"))  # a figure edited by hand
    diff = stale(readme, tmp_path)
    assert "-| GRPO | 0.800 [0.683" in diff and "+| GRPO | 0.733 [0.683" in diff and "README.md" in diff


def test_the_check_names_a_missing_chart(tmp_path):
    _results(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    update_docs([readme], tmp_path)
    (tmp_path / "docs" / "fab.png").unlink()
    assert "README.md:5: chart docs/fab.png is missing" in stale(readme, tmp_path)


def test_two_blocks_drawing_one_chart_from_other_rows_fail_before_anything_is_written(tmp_path):
    _results(tmp_path)
    readme, page = tmp_path / "README.md", tmp_path / "page.md"
    readme.write_text(README)
    page.write_text("<!-- r3rag:results results/fab.json all chart=docs/fab.png -->\n<!-- /r3rag:results -->\n")
    with pytest.raises(
        UserError, match=r"page.md:1: chart docs/fab.png is also drawn by .*README.md:5 from table 'headline'"
    ):
        update_docs([readme, page], tmp_path)
    assert readme.read_text() == README and not (tmp_path / "docs" / "fab.png").exists()
    page.write_text(page.read_text().replace(" all ", " headline "))  # the same rows twice: one chart
    written, found = update_docs([readme, page], tmp_path)
    assert found == 3 and written.count(tmp_path / "docs" / "fab.png") == 1


def test_blocks_of_other_results_files_are_left_alone(tmp_path):
    _results(tmp_path)
    text = README.replace("results/fab.json all", "results/other.json all")  # a file that does not exist
    new, blocks = regenerate(text, "README.md", tmp_path, only={(tmp_path / "results" / "fab.json").resolve()})
    assert len(blocks) == 1 and "<!-- r3rag:results results/other.json all -->\n<!-- /r3rag:results -->" in new


@pytest.mark.parametrize(
    "text, needles",
    [
        ("<!-- r3rag:results results/fab.json nope -->\n<!-- /r3rag:results -->\n", ["doc.md:1", "'nope'", "headline"]),
        ("x\n<!-- r3rag:results results/fab.json all -->\nno end\n", ["doc.md", "no closing"]),
        ("<!-- /r3rag:results -->\n", ["doc.md:1", "unopened"]),
        ("<!-- r3rag:results results/fab.json all\n<!-- /r3rag:results -->\n", ["doc.md:1", "malformed"]),
        ("<!-- r3rag:results results/fab.json all size=3 -->\n<!-- /r3rag:results -->\n", ["doc.md:1", "'size'"]),
        ("<!-- r3rag:results results/fab.json -->\n<!-- /r3rag:results -->\n", ["doc.md:1", "<table>"]),
        ("<!-- r3rag:results results/none.json all -->\n<!-- /r3rag:results -->\n", ["results/none.json", "no such"]),
        ("<!-- r3rag:results results/fab.json all by=hops -->\n<!-- /r3rag:results -->\n", ["doc.md:1", "by=searches"]),
    ],
)
def test_bad_markers_fail_with_one_line(tmp_path, text, needles):
    _results(tmp_path)
    with pytest.raises(UserError) as e:
        regenerate(text, "doc.md", tmp_path)
    assert all(n in str(e.value) for n in needles), str(e.value)


def test_many_search_counts_are_binned_and_drawn_against_the_searches(tmp_path):
    """A long-horizon eval's 1 to 32 searches: the table bins them by powers of two (the mean of
    each bin's counts), a `by=searches` chart draws EM against them; 1 to 4 stay one column each."""
    from r3rag.experiments.results.table import markdown

    path = _results(tmp_path)
    results = json.loads(path.read_text())
    results["rows"][1]["by_hops"] = {str(h): 1.0 if h <= 16 else 0.25 for h in range(1, 33)}
    results["rows"][1]["by_hops"]["12"] = 0.2  # 9-16: seven at 1.0 and one at 0.2
    path.write_text(json.dumps(results))
    table = markdown(results["rows"][:2], None)
    head = table.splitlines()[0]
    assert "| 1-hop EM | 2-hop EM | 3-4-hop EM | 5-8-hop EM | 9-16-hop EM | 17-32-hop EM |" in head
    grpo = next(line for line in table.splitlines() if line.startswith("| GRPO |")).split(" | ")
    assert grpo[3:9] == ["1.000", "1.000", "1.000", "1.000", "0.900", "0.250"]
    sft = next(line for line in table.splitlines() if line.startswith("| SFT |")).split(" | ")
    assert sft[3:9] == ["-", "0.372", "0.372", "-", "-", "-"]  # its counts 2 and 3 fall in bins 2 and 3-4
    assert "the mean of their EMs, each count alike" in table
    assert "2-hop EM | 3-hop EM" in markdown(results["rows"][:1], None)  # few counts: one column each
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- r3rag:results results/fab.json all by=searches chart=docs/lh.png -->\n<!-- /r3rag:results -->\n"
    )
    written, _ = update_docs([readme], tmp_path)
    assert (tmp_path / "docs" / "lh.png").read_bytes()[:8] == PNG and tmp_path / "docs" / "lh.png" in written
    assert "| 9-16-hop EM |" in readme.read_text()


def test_report_results_cli(tmp_path, monkeypatch):
    _results(tmp_path)
    (tmp_path / "README.md").write_text(README)
    monkeypatch.chdir(tmp_path)
    out = r3rag_inprocess("report", "--results", "results/fab.json")
    assert out.returncode == 0, out.stderr
    assert "README.md" in out.stdout and "| GRPO |" in (tmp_path / "README.md").read_text()
    again = r3rag_inprocess("report", "--results", "results/fab.json", "--docs", "README.md")
    assert "2 blocks up to date" in again.stdout
    assert_one_line_error(r3rag_inprocess("report", "--results", "results/other.json"), "no r3rag:results block")
    assert_one_line_error(r3rag_inprocess("report", "eval:latest", "--results", "results/fab.json"), "--results")


def _mini(tmp_path: Path, **changes) -> Path:
    """A small experiment that trains no RL: an SFT policy, the same policy on the dev split, and
    a second SFT seed (a row over seeds)."""
    evals = {"limit": 6, "max_turns": 3, "max_new_tokens": 16, "rl": ""}
    data = {
        "name": "mini",
        "stages": ["world", "index", "synthesize", "sft", "eval"],
        "world": {**TINY_WORLD, "n_clusters": 5, "dev_clusters": 1},
        "index": {"name": "bm25"},
        "synthesize": {"template": "minimal", "doc_style": "plain"},
        "sft": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "lr": 1e-2, "bf16": False},
        "eval": {**evals, "systems": ["sft"]},
        "variants": {"main": {}, "dev": {"set": ["eval.split=dev"]}, "s1": {"set": ["sft.seed=1"]}},
        "table": {"SFT": "main/sft", "SFT, dev split": "dev/sft", "SFT, 2 seeds": ["main/sft", "s1/sft"]},
        "results": {"path": "results/mini.json", "tables": {"head": ["SFT, 2 seeds"]}},
        **changes,
    }
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_an_experiment_writes_its_results_file(tmp_path, monkeypatch):
    from r3rag.experiments.run import run_file

    monkeypatch.chdir(tmp_path)  # the results path is relative to the working directory
    ref = run_file(_mini(tmp_path), [], tmp_path / "runs")
    out = tmp_path / "results" / "mini.json"
    results = json.loads(out.read_text())
    table = json.loads((ref.path / "table.json").read_text())
    assert results["table_artifact"] == ref.id and results["date"] == table["date"] and "cores" in results["machine"]
    assert results["tables"] == {"all": ["SFT", "SFT, dev split", "SFT, 2 seeds"], "head": ["SFT, 2 seeds"]}
    rows = {r["label"]: r for r in results["rows"]}
    assert [{k: v for k, v in r.items() if k != "runs"} for r in results["rows"]] == table["rows"]

    main, dev = rows["SFT"]["runs"][0], rows["SFT, dev split"]["runs"][0]
    assert (main["variant"], main["system"], main["split"], main["seed"]) == ("main", "sft", "test", 0)
    assert main["em"] == rows["SFT"]["em"] and main["n"] == 6 and len(main["em_ci"]) == 2 and "f1_ci" in main
    assert main["dev_em"] == dev["em"] and main["dev_from"] == "dev/sft" and dev["split"] == "dev"
    assert main["steps"]["sft"] > 0 and main["train_seconds"] > 0 and main["eval_seconds"] > 0
    assert main["compute"]["sft"]["jobs"] == 1 and main["compute"]["sft"]["threads"] >= 1  # a plain run, alone
    assert main["settings"]["sft.layers"] == 1 and main["settings"]["world.dev_clusters"] == 1
    assert "eval.split" not in main["settings"] and dev["settings"]["eval.split"] == "dev"  # only non-defaults
    assert "sft.world" not in main["settings"] and "eval.name" not in main["settings"]  # inputs: artifact ids
    assert set(main["artifacts"]) == {"world", "index", "synthesize", "sft", "eval"}
    assert main["artifacts"]["sft"] == dev["artifacts"]["sft"] != rows["SFT, 2 seeds"]["runs"][1]["artifacts"]["sft"]
    seeds = rows["SFT, 2 seeds"]["runs"]
    assert [(r["variant"], r["seed"], r["set"]) for r in seeds] == [("main", 0, []), ("s1", 1, ["sft.seed=1"])]
    assert rows["SFT, 2 seeds"]["n_seeds"] == 2 and rows["SFT, 2 seeds"]["em"] == round(
        (seeds[0]["em"] + seeds[1]["em"]) / 2, 4
    )
    assert not list(out.parent.glob(".*part"))  # the temp file was renamed into place

    first = out.read_text()
    out.write_text("{}")
    assert run_file(_mini(tmp_path), [], tmp_path / "runs").path == ref.path  # every artifact reused
    assert out.read_text() == first  # the same file: a rerun does not churn the committed one

    doc = tmp_path / "README.md"
    doc.write_text(f"<!-- r3rag:results results/mini.json head -->\n{CLOSE}\n")
    update_docs([doc], tmp_path)
    assert "| SFT, 2 seeds |" in doc.read_text() and "| SFT |" not in doc.read_text()
    assert stale(doc, tmp_path) == ""


@pytest.mark.parametrize(
    "results, needles",
    [
        ({"path": "r.json", "tables": {"head": ["nope"]}}, ["results.tables.head", "'nope'"]),
        ({"path": "r.json", "tables": {"all": ["SFT"]}}, ["results.tables", "`all`"]),
        ("results/mini.md", ["'results/mini.md'", ".json"]),
        ({"file": "r.json"}, ["results:", "path and tables"]),
    ],
)
def test_bad_results_settings_fail_before_anything_runs(tmp_path, results, needles):
    out = r3rag_inprocess("run", _mini(tmp_path, results=results), "--dry-run", "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, *needles)


def test_a_plain_pipeline_with_results_fails(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "world": TINY_WORLD, "results": "results/p.json"}))
    assert_one_line_error(r3rag_inprocess("run", path, "--dry-run"), "results:", "only an experiment")


def test_replicate_pipelines_name_their_own_results_files():
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.results.file import results_spec

    paths = {
        name: results_spec(ROOT / "pipelines" / f"{name}.yaml", load_pipeline(ROOT / "pipelines" / f"{name}.yaml"))[
            "path"
        ]
        for name in (
            "replicate",
            "replicate-ablations",
            "replicate-dev",
            "replicate-extras",
            "real-smollm2-seeds",
            "real-smollm2-dev",
        )
    }
    assert len(set(paths.values())) == 6 and paths["replicate"] == Path("results/replicate.json")
