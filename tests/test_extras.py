"""The optional extras: without them `r3rag --help` works, and each feature that needs one stops
with one line naming the extra to install.

Each check runs in a fresh interpreter in which the extras' packages cannot be imported, as on a
bare `pip install r3rag`: the path finder on sys.meta_path is wrapped so that it cannot see them
(`importlib.util.find_spec` gives None, an import raises ModuleNotFoundError). The runs it reads (a
world, its BM25 index, an eval of a scripted system) are built here with every package available."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli_helpers import assert_one_line_error

# The import names of every optional package (pyproject.toml's extras).
BLOCKED = ("faiss", "rank_bm25", "fastapi", "uvicorn", "uvloop", "httptools", "matplotlib", "gguf", "vllm")

BLOCK = f"""
import importlib.machinery, sys

class _Without:
    '''The path finder, blind to the blocked packages: find_spec gives None and an import raises
    ModuleNotFoundError, as for a package that is not installed.'''

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):  # invalidate_caches, find_distributions
        return getattr(self.inner, attr)

sys.meta_path[:] = [_Without(f) if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""

# Runs each CLI invocation (a JSON list of argument lists in argv[1]) in this one interpreter and
# prints one JSON line per invocation: the exit code, stdout and stderr (a traceback for an exception
# that escaped the CLI), as tests/cli_helpers.r3rag_inprocess does.
RUN_CLI = """
import json, traceback
from typer.testing import CliRunner
from r3rag.cli.app import app

for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(app, args)
    err = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        err += "".join(traceback.format_exception(result.exception))
    print(json.dumps({"code": result.exit_code, "stdout": result.stdout, "stderr": err}))
"""


def _python(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def _cli(calls: list[list[str]], cwd) -> list[subprocess.CompletedProcess]:
    out = _python(RUN_CLI, json.dumps(calls), cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(calls), out.stdout[-3000:]
    return [subprocess.CompletedProcess(c, r["code"], r["stdout"], r["stderr"]) for c, r in zip(calls, rows)]


def test_the_blocker_really_blocks():
    """Without this the other tests here would pass on an install that has every extra."""
    out = _python(
        "import importlib, importlib.util\n"
        f"for m in {BLOCKED!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ModuleNotFoundError:\n"
        "        print('blocked', m)\n"
        "from r3rag.util.extras import installed\n"
        f"print('installed', [m for m in {BLOCKED!r} if installed(m)])\n"
    )
    assert out.returncode == 0, out.stderr
    assert [line.split()[1] for line in out.stdout.splitlines() if line.startswith("blocked")] == list(BLOCKED)
    assert "installed []" in out.stdout


def test_help_works_without_any_extra(tmp_path):
    out = _python("from r3rag.cli.app import main\nsys.argv = ['r3rag', '--help']\nmain()\n", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for command in ("world", "index", "rl", "eval", "report", "serve-retriever", "import-model"):
        assert command in out.stdout
    # every subcommand's help, and the modules behind the optional features, import without extras
    names = _python(
        "import typer.main\nfrom r3rag.cli.app import app\nprint(' '.join(typer.main.get_command(app).commands))\n"
    ).stdout.split()
    assert "serve-retriever" in names and "index" in names
    for result in _cli([[name, "--help"] for name in names], tmp_path):
        assert result.returncode == 0 and "Usage" in result.stdout, (result.args, result.stderr[-2000:])
    modules = (
        "r3rag.retrieval",
        "r3rag.retrieval.dense",
        "r3rag.retrieval.hybrid",
        "r3rag.retrieval.rank_bm25_backend",
        "r3rag.evaluation.report",
        "r3rag.experiments.results.table",
        "r3rag.training.observe",
        "r3rag.training.model_import",
        "r3rag.generation.vllm",
        "r3rag.stages.report",
    )
    out = _python("".join(f"import {m}\n" for m in modules) + "print('imported')\n")
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr[-3000:]


@pytest.fixture(scope="module")
def runs_with_an_eval(world_index_runs):
    """The world and its BM25 index, plus an eval of the scripted top-title system (no model)."""
    from r3rag.experiments.pipeline import run_stage

    run_stage(
        "eval",
        None,
        ["name=scripted", "systems=[top]", "models.top.scripted=top-title", "limit=4", "rl=", "sft="],
        world_index_runs,
    )
    return world_index_runs


@pytest.fixture(scope="module")
def without_extras(runs_with_an_eval, tmp_path_factory):
    """Each optional feature through the CLI, in one interpreter without the extras."""
    runs = str(runs_with_an_eval)
    gguf = tmp_path_factory.mktemp("gguf") / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))  # never read: the missing package is reported first
    calls = {
        "dense": ["index", "--runs-dir", runs, "--set", "backend=dense", "--set", "name=dense"],
        "hybrid": ["index", "--runs-dir", runs, "--set", "backend=hybrid", "--set", "name=hybrid"],
        "rank-bm25": ["index", "--runs-dir", runs, "--set", "backend=rank-bm25", "--set", "name=okapi"],
        "server": ["serve-retriever", "--runs-dir", runs, "--port", "0"],
        "plots": ["report", "--runs-dir", runs, "--name", "noplots"],
        "real": ["import-model", str(gguf), "--runs-dir", runs],
    }
    results = _cli(list(calls.values()), runs_with_an_eval.parent)
    return runs_with_an_eval, dict(zip(calls, results))


@pytest.mark.parametrize(
    "feature, needles",
    [
        ("dense", ["index backend=dense or hybrid", "faiss-cpu", "pip install 'r3rag[dense]'"]),
        ("hybrid", ["faiss-cpu", "pip install 'r3rag[dense]'"]),
        ("rank-bm25", ["index backend=rank-bm25", "rank-bm25", "pip install 'r3rag[rank-bm25]'"]),
        ("server", ["r3rag serve-retriever", "fastapi", "pip install 'r3rag[server]'"]),
        ("plots", ["r3rag report", "matplotlib", "pip install 'r3rag[plots]'"]),
        ("real", ["reading GGUF files", "gguf", "pip install 'r3rag[real]'"]),
    ],
)
def test_a_feature_without_its_extra_is_one_line_naming_it(without_extras, feature, needles):
    runs, results = without_extras
    assert_one_line_error(results[feature], "needs the optional package", *needles)
    # nothing was published for the failed command
    published = {p.name.split("-")[0] for stage in runs.iterdir() if stage.is_dir() for p in stage.iterdir()}
    assert not published & {"dense", "hybrid", "okapi", "noplots"}
    assert not (runs / "model").exists() or not any((runs / "model").iterdir())


def test_by_product_plots_are_skipped_with_a_note_and_vllm_names_its_extra(tmp_path):
    """rl's reward curves and an experiment's table.png come after the work is done: without
    [plots] they are left out with a note instead of failing the run."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward": 0.5}\n')
    out = _python(
        "from pathlib import Path\n"
        "from r3rag.util.errors import UserError\n"
        "from r3rag.training.observe import plot_rewards\n"
        "from r3rag.experiments.results.table import plot\n"
        "from r3rag.generation.vllm import require_vllm\n"
        f"plot_rewards(Path({str(metrics)!r}), Path({str(tmp_path / 'curves.png')!r}))\n"
        f"plot([{{'em': 0.5, 'em_ci': None, 'label': 'x'}}], Path({str(tmp_path / 'table.png')!r}))\n"
        "try:\n"
        "    require_vllm('eval.backend=vllm')\n"
        "except UserError as e:\n"
        "    print('vllm:', e)\n"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    notes = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: the plot curves.png needs the optional package matplotlib: pip install 'r3rag[plots]' (skipped)",
        "note: the plot table.png needs the optional package matplotlib: pip install 'r3rag[plots]' (skipped)",
    ]
    assert not (tmp_path / "curves.png").exists() and not (tmp_path / "table.png").exists()
    assert (
        "vllm: eval.backend=vllm: vLLM is not installed (make install-vllm on a CPU machine, pip install 'r3rag[vllm]'"
        in out.stdout
    )


def test_with_the_extras_installed_the_same_calls_write_their_outputs(tmp_path):
    """The other side: where matplotlib is installed (the dev install) the plot is written."""
    pytest.importorskip("matplotlib")
    from r3rag.training.observe import plot_rewards

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward": 0.5}\n')
    plot_rewards(metrics, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
