"""The bad-input matrix: every command that reads a file, fed every kind of broken input file and
artifact (broken settings and pipeline files: tests/test_bad_settings.py).

Each case must exit non-zero with exactly one line `error: ...` naming the file (and line, for
JSONL) and what is wrong, show no traceback (only with --debug), and leave nothing new in the
runs dir: no artifact, no temp directory (tests/bad_input_helpers.check). The CLI runs in-process
(typer's runner) so the ~100 cases take seconds; tests/test_cli.py covers the same errors through a real subprocess.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.bad_input_helpers import BIG, Env, base, check, env  # noqa: F401 (fixtures)
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import TINY_WORLD


def _jsonl(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# ------------------------------------------------------------------ JSONL inputs, case by case

DOC = {"id": "d1", "title": "Ava", "text": "Ava Smith lives in Orlin."}
QUESTION = {"id": "q1", "question": "Where does Ava live?", "golden_answers": ["Orlin"]}
HOPS = {"id": "q1", "queries": ["Ava Smith"]}


def jsonl_cases(good: dict, drop: str, wrong: tuple[str, object], wrong_needle: str, dup_needle="duplicate id"):
    """(case id, file content or None, needles) for one JSONL input; the bad line is line 2."""
    bad_key, bad_value = wrong
    other = {**good, "id": "x2"}
    return [
        ("missing-file", None, ["not found"]),
        ("empty-file", "", ["empty"]),
        ("malformed-json", _jsonl(good) + '{"id": "x2", \n', [":2:", "malformed JSON"]),
        ("missing-field", _jsonl(good, {k: v for k, v in other.items() if k != drop}), [":2:", repr(drop)]),
        ("wrong-type", _jsonl(good, {**other, bad_key: bad_value}), [":2:", wrong_needle]),
        ("duplicate-id", _jsonl(good, good), [":2:", dup_needle]),
        ("non-utf8", _jsonl(good).encode() + b'{"id": "x2", "text": "caf\xe9"}\n', [":2:", "UTF-8"]),
        ("10mb-line", b'{"id": "x1", "text": "' + b"a" * BIG, [":1:", "malformed JSON"]),
    ]


def _index(e: Env, f: Path):
    return ["index", "--runs-dir", e.runs, "--set", f"corpus={f}", "--set", "world="]


def _eval_q(e: Env, f: Path):
    return [
        "eval",
        "--runs-dir",
        e.runs,
        "--set",
        f"questions={f}",
        "--set",
        "world=",
        "--set",
        "sft=",
        "--set",
        "rl=",
        "--set",
        "systems=[tt]",
        "--set",
        "models.tt.scripted=top-title",
    ]


def _import(e: Env, f: Path):
    return ["import", f, "--out", e.root / "out.jsonl"]


def _eval_retrieval(e: Env, f: Path):
    return ["eval-retrieval", f, "--runs-dir", e.runs]


def _hop_queries(e: Env, f: Path):
    q = e.file("q.jsonl", _jsonl(QUESTION, {**QUESTION, "id": "x2"}))
    return ["eval-retrieval", q, "--runs-dir", e.runs, "--hop-queries", f]


FILE_COMMANDS = {
    "index-corpus": (_index, jsonl_cases(DOC, "id", ("text", 5), "must be strings")),
    "eval-questions": (_eval_q, jsonl_cases(QUESTION, "question", ("golden_answers", "Orlin"), "'golden_answers'")),
    "import": (_import, jsonl_cases(QUESTION, "question", ("golden_answers", "Orlin"), "'golden_answers'")),
    "eval-retrieval": (_eval_retrieval, jsonl_cases(QUESTION, "question", ("question", 7), "'question'")),
    "eval-retrieval-hops": (_hop_queries, jsonl_cases(HOPS, "queries", ("queries", "Ava"), "'queries'")),
}
FILE_CASES = [
    pytest.param(cmd, name, content, needles, id=f"{cmd}-{name}")
    for cmd, (_, cases) in FILE_COMMANDS.items()
    for name, content, needles in cases
]


@pytest.mark.parametrize("cmd, name, content, needles", FILE_CASES)
def test_bad_jsonl_file(env, cmd, name, content, needles):
    make_args, _ = FILE_COMMANDS[cmd]
    f = env.file(f"in-{name}.jsonl", content)
    check(env, make_args(env, f), f.name, *needles)


# ------------------------------------------------------------------ artifacts given as inputs


def _stage_args(stage: str, field: str, value, e: Env) -> list:
    """`r3rag <stage>` with one input replaced; the rest of the inputs are valid."""
    if stage == "report":
        return ["report", value, "--runs-dir", e.runs]
    if stage == "serve-retriever":
        return ["serve-retriever", "--index", value, "--runs-dir", e.runs, "--port", "1"]
    if stage == "eval-retrieval":
        return ["eval-retrieval", e.file("q.jsonl", _jsonl(QUESTION)), "--index", value, "--runs-dir", e.runs]
    extra = {"eval": ["--set", "systems=[sft]", "--set", "rl="]}.get(stage, [])
    return [stage, "--runs-dir", e.runs, "--set", f"{field}={value}", *extra]


# (command, input field, the stage it expects, another stage's artifact to give it instead)
ARTIFACT_INPUTS = [
    ("index", "world", "world", "index"),
    ("synthesize", "world", "world", "synthesize"),
    ("synthesize", "index", "index", "world"),
    ("sft", "data", "synthesize", "world"),
    ("rl", "policy", "sft", "synthesize"),
    ("eval", "sft", "sft", "index"),
    ("eval", "index", "index", "world"),
    ("report", "", "eval", "sft"),
    ("serve-retriever", "", "index", "world"),
    ("eval-retrieval", "", "index", "synthesize"),
]
ART_IDS = [f"{c}-{f or s}" for c, f, s, _ in ARTIFACT_INPUTS]


@pytest.mark.parametrize("cmd, field, stage, other", ARTIFACT_INPUTS, ids=ART_IDS)
def test_wrong_stage_artifact(env, cmd, field, stage, other):
    wrong = env.art(other)
    check(env, _stage_args(cmd, field, wrong, env), wrong.name, f"is a '{other}' artifact, expected '{stage}'")


@pytest.mark.parametrize("cmd, field, stage, other", ARTIFACT_INPUTS, ids=ART_IDS)
def test_artifact_changed_after_manifest(env, cmd, field, stage, other):
    path = env.tampered(stage)
    check(env, _stage_args(cmd, field, path, env), path.name, "content hash does not match")


@pytest.mark.parametrize("cmd, field, stage, other", ARTIFACT_INPUTS, ids=ART_IDS)
def test_missing_artifact(env, cmd, field, stage, other):
    check(env, _stage_args(cmd, field, env.root / "no-such-artifact", env), "no-such-artifact", "not found")


@pytest.mark.parametrize("cmd, field, stage, other", ARTIFACT_INPUTS, ids=ART_IDS)
def test_artifact_with_unreadable_manifest(env, cmd, field, stage, other):
    path = env.art(stage)
    (path / "manifest.json").write_text('{"stage": ')
    check(env, _stage_args(cmd, field, path, env), path.name, "no manifest.json")


def test_manifest_without_content_hash(env):
    path = env.art("world")
    m = json.loads((path / "manifest.json").read_text())
    del m["content_hash"]
    (path / "manifest.json").write_text(json.dumps(m))
    check(env, _stage_args("index", "world", path, env), path.name, "no manifest.json")


def test_broken_file_inside_an_artifact(env):
    """A file an artifact committed broken (its hash matches) is still reported by file:line."""
    check(env, ["report", env.art("eval"), "--runs-dir", env.runs], "predictions.jsonl:2", "malformed JSON")


# ------------------------------------------------------------------ models


@pytest.mark.parametrize(
    "args",
    [
        ["sft", "--set", "model=/no/such/model", "--set", "world="],
        ["eval", "--set", "systems=[m]", "--set", "models.m.model=/no/such/model", "--set", "sft=", "--set", "rl="],
        ["rl", "--set", "model=/no/such/model", "--set", "policy="],
    ],
    ids=["sft", "eval", "rl"],
)
def test_model_path_that_does_not_exist(env, args):
    """Also no empty runs/eval or runs/rl/.work-<id> left behind (issue 19)."""
    check(env, [args[0], "--runs-dir", env.runs, *args[1:]], "/no/such/model", "does not exist")


def test_model_dir_that_is_not_a_model(env):
    empty = env.root / "empty-model"
    empty.mkdir()
    check(
        env,
        ["sft", "--runs-dir", env.runs, "--set", f"model={empty}", "--set", "world="],
        "empty-model",
        "could not load",
    )


# ------------------------------------------------------------------ --debug shows the traceback


def test_debug_shows_the_traceback(env):
    missing = env.root / "nope.jsonl"
    out = r3rag_inprocess(*_index(env, missing), "--debug")
    assert out.returncode != 0 and "Traceback" in out.stderr and "UserError" in out.stderr


# ------------------------------------------------------------------ artifact ids, messages, what a failure leaves


def _copy_with_same_suffix(e: Env) -> tuple[Path, Path]:
    """A second world artifact whose id ends like the first's (a copy under another name)."""
    world = e.art("world")
    other = world.parent / f"copy-{world.name}"
    shutil.copytree(world, other)
    return world, other


def test_artifact_suffix_that_matches_several(env):
    world, other = _copy_with_same_suffix(env)
    suffix = world.name.rsplit("-", 1)[1]
    check(
        env,
        ["index", "--runs-dir", env.runs, "--set", f"world=world:{suffix}"],
        f"world:{suffix}",
        "2 world artifacts",
        world.name,
        other.name,
        "give more of the id",
    )


def test_artifact_id_that_is_exact_wins_over_suffixes(env):
    from r3rag.core.artifacts import resolve

    world, other = _copy_with_same_suffix(env)
    assert resolve(f"world:{world.name}", "world", env.runs).path == world
    assert resolve(f"world:{other.name}", "world", env.runs).path == other


def _corpus_broken_at_line_100(folder: Path) -> Path:
    folder.mkdir()
    f = folder / "corpus.jsonl"
    f.write_text(_jsonl(*({**DOC, "id": f"d{i}"} for i in range(99))) + '{"id": \n')
    return f


def test_error_text_is_printed_literally(env):
    """rich printed `:100:` as an emoji and read `[bold]` as markup."""
    f = _corpus_broken_at_line_100(env.root / "[red]dir[bold]")
    out = r3rag_inprocess(*_index(env, f))
    assert_one_line_error(out, f"{f}:100:", "malformed JSON")
    assert "\N{HUNDRED POINTS SYMBOL}" not in out.stderr


def test_progress_messages_are_printed_literally(env, monkeypatch):
    """The user's paths as they are: in a stage's message, a --dry-run plan, `r3rag runs` and the
    eval-retrieval table."""
    monkeypatch.setenv("COLUMNS", "400")  # tables on one line per row
    runs = env.root / "runs[red]:100:"
    out = r3rag_inprocess("world", "--runs-dir", runs, *(f"--set={k}={v}" for k, v in TINY_WORLD.items()))
    assert out.returncode == 0, out.stderr
    assert f"wrote {runs}/world/" in out.stderr
    out = r3rag_inprocess("runs", "--runs-dir", runs)
    assert out.returncode == 0 and f"artifacts in {runs}" in out.stdout, out.stderr
    p = env.file("p.yaml", "name: x\nsynthesize:\n  questions: q[red]:100:.jsonl\n")
    out = r3rag_inprocess("run", p, "--dry-run", "--runs-dir", runs)
    assert out.returncode == 0, out.stderr
    assert "questions: q[red]:100:.jsonl (missing" in out.stdout
    q = env.file("q[red]:100:.jsonl", _jsonl(QUESTION))
    out = r3rag_inprocess("eval-retrieval", q, "--runs-dir", env.runs)
    assert out.returncode == 0 and f"on {q.name} (n=1" in " ".join(out.stderr.split()), out.stderr  # a title wraps


def test_failed_command_creates_no_runs_dir(env):
    """A missing model used to leave empty runs/ and runs/eval/ behind."""
    runs = env.root / "fresh-runs"
    q = env.file("q.jsonl", _jsonl(QUESTION))
    out = r3rag_inprocess(
        "eval",
        "--runs-dir",
        runs,
        "--set",
        f"questions={q}",
        "--set",
        "world=",
        "--set",
        "sft=",
        "--set",
        "rl=",
        "--set",
        "systems=[m]",
        "--set",
        "models.m.model=/no/such/model",
        "--set",
        "models.m.mode=direct",
    )
    assert_one_line_error(out, "/no/such/model", "does not exist")
    assert not runs.exists()


def test_failed_command_leaves_no_empty_work_files(env):
    """rl made runs/rl/.work-<id> and synthesize an empty journal before loading the model."""
    check(
        env,
        ["synthesize", "--runs-dir", env.runs, "--set", "teacher=hf", "--set", "model=/no/such/model"],
        "/no/such/model",
    )
    assert not list((env.runs / "synthesize").glob(".journal-*"))
    check(env, ["rl", "--runs-dir", env.runs, "--set", "model=/no/such/model", "--set", "policy="], "/no/such/model")
    assert not (env.runs / "rl").exists()


def test_what_a_rerun_resumes_from_is_kept(env):
    """Only empty leftovers go: a journal with lines (an interrupted run's work) stays."""
    from r3rag.core.artifacts import ArtifactWriter

    w = ArtifactWriter("synthesize", "x", {"a": 1}, {}, env.runs)
    journal = w.final.parent / f".journal-{w.id}.jsonl"
    journal.write_text('{"id": "1"}\n')
    w.discard()
    assert journal.exists()
