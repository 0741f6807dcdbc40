"""The CLI: help on every command, one clear error line and a non-zero exit on bad input."""

from pathlib import Path

import pytest

from tests.cli_helpers import assert_one_line_error, r3rag
from tests.test_rl import GPU_RECIPES

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = [
    "world",
    "index",
    "synthesize",
    "sft",
    "rl",
    "eval",
    "run",
    "runs",
    "serve-retriever",
    "report",
    "eval-retrieval",
    "import",
]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_is_useful(cmd):
    """`--help` shows the command's usage line, the start of its own summary and every option it takes."""
    import typer.main

    from r3rag.cli.app import app

    command = typer.main.get_command(app).commands[cmd]
    out = r3rag(cmd, "--help")
    assert out.returncode == 0 and f" {cmd} [OPTIONS]" in out.stdout, out.stdout
    text = " ".join(out.stdout.replace("│", " ").replace("`", "").split())  # as rendered: panels, no code marks
    summary = " ".join((command.help or "").replace("`", "").split()[:4])
    assert summary and summary in text, (summary, text[:500])
    options = [p.opts[0] for p in command.params if p.param_type_name == "option" and not p.hidden]
    assert options
    for option in options:
        assert option in out.stdout, option


def test_missing_config_file(tmp_path):
    assert_one_line_error(
        r3rag("world", "--config", str(tmp_path / "nope.yaml"), cwd=tmp_path), "nope.yaml", "not found"
    )


def test_unknown_key(tmp_path):
    assert_one_line_error(r3rag("world", "--set", "seeds=3", cwd=tmp_path), "unknown key 'seeds'")
    p = tmp_path / "p.yaml"
    p.write_text("name: x\nworld:\n  seed: 1\n  colour: red\n")
    assert_one_line_error(r3rag("run", str(p), cwd=tmp_path), "p.yaml", "unknown key 'colour'")


def test_missing_input_artifact(tmp_path):
    assert_one_line_error(r3rag("index", cwd=tmp_path), "no complete world artifact")


def test_malformed_corpus_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "t\\ntext"}\n{"id": 2, "contents": \n')
    assert_one_line_error(
        r3rag("index", "--set", f"corpus={corpus}", "--set", "world=", cwd=tmp_path), "c.jsonl:2", "malformed JSON"
    )
    assert not (tmp_path / "runs" / "index").exists() or not any((tmp_path / "runs" / "index").iterdir())


def test_missing_model_path(tmp_path, pipeline_runs):
    runs, _ = pipeline_runs
    out = r3rag("sft", "--runs-dir", str(runs), "--set", f"model={tmp_path}/no-model", "--set", "world=", cwd=tmp_path)
    assert_one_line_error(out, "no-model", "does not exist")


def test_eval_retrieval_on_real_hotpotqa(tmp_path, shared_root):
    import json

    root = shared_root
    runs = tmp_path / "runs"
    corpus = root / "corpus/hotpotqa_dev_context_pool.jsonl"
    assert r3rag("index", "--runs-dir", str(runs), "--set", f"corpus={corpus}", "--set", "world=").returncode == 0
    qfile = root / "hotpotqa/dev_distractor_ircot_subsample.jsonl"
    first = json.loads(qfile.read_text().splitlines()[0])
    gold = sorted(first["metadata"]["supporting_titles"])
    hops = tmp_path / "hops.jsonl"
    hops.write_text(json.dumps({"id": first["id"], "queries": gold}) + "\n")  # the titles as queries: oracle hops
    out = r3rag(
        "eval-retrieval",
        str(qfile),
        "--runs-dir",
        str(runs),
        "--limit",
        "1",
        "--ks",
        "1,10",
        "--hop-queries",
        str(hops),
    )
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["n"] == 1 and m["n_gold"] == 1
    assert m["hops_recall@10"] == 1.0 and 0.0 <= m["recall@1"] <= 0.5


def test_run_dry_run_validates_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    out = r3rag("run", "pipelines/demo.yaml", "--dry-run", "--runs-dir", str(runs), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "this run's sft" in out.stdout and "extra_worlds=35" in out.stdout and "config is valid" in out.stdout
    assert not runs.exists()
    out = r3rag("run", "pipelines/demo.yaml", "--dry-run", "--runs-dir", str(runs), "--set", "sft.lr=fast", cwd=ROOT)
    assert_one_line_error(out, "sft.lr", "expected a number")
    out = r3rag("run", "pipelines/demo.yaml", "--dry-run", "--set", "eval.systems=[foo]", cwd=ROOT)
    assert_one_line_error(out, "unknown system 'foo'")


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_real_model_recipes_dry_run(name, tmp_path):
    """The GPU recipes validate end to end without their models, corpora or a GPU."""
    from r3rag.experiments.pipeline import plan_pipeline

    plan = plan_pipeline(ROOT / "pipelines" / name, [], tmp_path / "runs")
    stages = [row["stage"] for row in plan]
    assert stages == (["index", "synthesize", "sft", "rl"] if name.startswith("r3rag") else ["index", "rl"])
    assert "Qwen/Qwen2.5" in str(plan)
    assert not (tmp_path / "runs").exists()
