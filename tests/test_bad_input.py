"""The bad-input matrix: every command that reads a file, fed every kind of broken input.

Each case must exit non-zero with exactly one line `error: ...` naming the file (and line, for
JSONL) and what is wrong, show no traceback (only with --debug), and leave nothing new in the
runs dir: no artifact, no temp directory. The CLI runs in-process (typer's runner) so the ~120
cases take seconds; tests/test_cli.py covers the same errors through a real subprocess.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from r3rag.artifacts import ArtifactWriter, list_artifacts
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import TINY_WORLD

BIG = 10 * 1024 * 1024  # the "10 MB single line"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runs dir with real world, index and synthesize artifacts and small fake sft/eval ones
    (resolving an input only reads its manifest and hashes its files: no training needed)."""
    from r3rag.pipeline import run_stage

    runs = tmp_path_factory.mktemp("base") / "runs"
    run_stage("world", None, [f"{k}={v}" for k, v in TINY_WORLD.items()], runs)
    run_stage("index", None, [], runs)
    run_stage("synthesize", None, ["template=minimal", "doc_style=plain"], runs)
    with ArtifactWriter("sft", "fake", {"model": "tiny"}, {}, runs) as w:
        (w.dir / "model").mkdir()
        (w.dir / "model" / "config.json").write_text("{}")
    with ArtifactWriter("eval", "fake", {"limit": 1}, {}, runs) as w:
        (w.dir / "metrics.json").write_text(json.dumps({"systems": {"x": {"em": 0.5, "f1": 0.5, "n": 2}}}))
        (w.dir / "predictions.jsonl").write_text('{"id": "1"}\n{"id": \n')  # broken, but hashed as written
    return runs


@pytest.fixture
def env(base, tmp_path, monkeypatch):
    """A private copy of the runs dir (cases tamper with it) and a scratch dir as cwd."""
    runs = tmp_path / "runs"
    shutil.copytree(base, runs)
    monkeypatch.chdir(tmp_path)
    return Env(tmp_path, runs)


class Env:
    def __init__(self, root: Path, runs: Path):
        self.root, self.runs = root, runs

    def art(self, stage: str) -> Path:
        return list_artifacts(self.runs, stage)[0].path

    def tampered(self, stage: str) -> Path:
        """An artifact one of whose files changed after its manifest was written."""
        path = self.art(stage)
        victim = next(p for p in sorted(path.rglob("*")) if p.is_file() and p.name != "manifest.json")
        victim.write_bytes(victim.read_bytes() + b" ")
        return path

    def file(self, name: str, content: bytes | str | None) -> Path:
        path = self.root / name
        if content is not None:
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path


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
    return ["eval", "--runs-dir", e.runs, "--set", f"questions={f}", "--set", "world=", "--set", "sft=",
            "--set", "rl=", "--set", "systems=[tt]", "--set", "models.tt.scripted=top-title"]


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
FILE_CASES = [pytest.param(cmd, name, content, needles, id=f"{cmd}-{name}")
              for cmd, (_, cases) in FILE_COMMANDS.items() for name, content, needles in cases]


def _snapshot(runs: Path) -> set[str]:
    """Everything in the runs dir: artifacts and any (hidden) temp directories."""
    return {p.relative_to(runs).as_posix() for p in runs.glob("*/*")}


def check(e: Env, args, *needles, keeps_work_dir: bool = False):
    """`keeps_work_dir`: rl keeps runs/rl/.work-<id> (its checkpoints, for --resume), which
    holds no manifest and is replaced by the next run."""
    before = _snapshot(e.runs)
    out = r3rag_inprocess(*args)
    assert_one_line_error(out, *needles)
    assert len(out.stderr) < 1000  # never echoes a 10 MB line back
    new = _snapshot(e.runs) - before
    if keeps_work_dir:
        new = {p for p in new if not p.startswith("rl/.work-") or (e.runs / p / "manifest.json").exists()}
    assert not new and _snapshot(e.runs) >= before, f"the failed command left {new} in runs/"
    assert not (e.root / "out.jsonl").exists()


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

@pytest.mark.parametrize("args", [
    ["sft", "--set", "model=/no/such/model", "--set", "world="],
    ["eval", "--set", "systems=[m]", "--set", "models.m.model=/no/such/model", "--set", "sft=", "--set", "rl="],
    ["rl", "--set", "model=/no/such/model", "--set", "policy="],
], ids=["sft", "eval", "rl"])
def test_model_path_that_does_not_exist(env, args):
    check(env, [args[0], "--runs-dir", env.runs, *args[1:]], "/no/such/model", "does not exist",
          keeps_work_dir=args[0] == "rl")


def test_model_dir_that_is_not_a_model(env):
    empty = env.root / "empty-model"
    empty.mkdir()
    check(env, ["sft", "--runs-dir", env.runs, "--set", f"model={empty}", "--set", "world="],
          "empty-model", "could not load")


# ------------------------------------------------------------------ configs and pipelines

STAGES = ["world", "index", "synthesize", "sft", "rl", "eval"]
KEY_OF = {"world": "seed", "index": "k1", "synthesize": "limit", "sft": "epochs", "rl": "steps", "eval": "limit"}


@pytest.mark.parametrize("stage", STAGES)
def test_unknown_config_key(env, stage):
    args = [stage, "--runs-dir", env.runs]
    p = env.file("p.yaml", f"{stage}:\n  colour: red\n")
    check(env, [*args, "--config", p], "p.yaml", f"{stage}: unknown key 'colour'")
    check(env, [*args, "--set", "colour=red"], "unknown key 'colour'")


@pytest.mark.parametrize("stage", STAGES)
def test_wrong_config_type(env, stage):
    key = KEY_OF[stage]
    p = env.file("p.yaml", f"{stage}:\n  {key}: [1, 2]\n")
    check(env, [stage, "--runs-dir", env.runs, "--config", p], "p.yaml", f"{stage}.{key}", "expected")
    check(env, [stage, "--runs-dir", env.runs, "--set", f"{key}=lots"], f"{key}", "expected")


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "x" * 300, ".hidden"])
def test_bad_artifact_name(env, name):
    check(env, ["world", "--runs-dir", env.runs, "--set", f"name={name}"], "name", "must be")


PIPELINE_CASES = [
    ("missing-file", None, ["not found"]),
    ("empty-file", "", ["no stages"]),
    ("malformed-yaml", "name: x\nworld:\n  seed: [1\n", ["line", "invalid YAML"]),
    ("not-a-mapping", "- world\n- index\n", ["expected a mapping"]),
    ("unknown-top-key", "name: x\ncolour: red\n", ["unknown top-level key 'colour'"]),
    ("unknown-stage-key", "name: x\nworld:\n  colour: red\n", ["world: unknown key 'colour'"]),
    ("wrong-type", "name: x\nworld:\n  seed: abc\n", ["world.seed", "expected an integer"]),
    ("section-not-mapping", "name: x\nworld: 3\n", ["'world' must be a mapping"]),
    ("unknown-stage", "name: x\nstages: [world, train]\nworld: {}\n", ["unknown stage 'train'"]),
    ("non-utf8", b"name: caf\xe9\nworld: {}\n", ["UTF-8"]),
    ("10mb-line", b"name: [" + b"a," * (BIG // 2), ["too large"]),
]


@pytest.mark.parametrize("name, content, needles", PIPELINE_CASES, ids=[c[0] for c in PIPELINE_CASES])
def test_bad_pipeline_file(env, name, content, needles):
    p = env.file(f"pipe-{name}.yaml", content)
    check(env, ["run", p, "--runs-dir", env.runs], p.name, *needles)
    if name not in ("empty-file", "unknown-stage", "not-a-mapping", "unknown-top-key"):  # same loader for --config
        check(env, ["world", "--config", p, "--runs-dir", env.runs], p.name, *needles)


# ------------------------------------------------------------------ --debug shows the traceback

def test_debug_shows_the_traceback(env):
    missing = env.root / "nope.jsonl"
    out = r3rag_inprocess(*_index(env, missing), "--debug")
    assert out.returncode != 0 and "Traceback" in out.stderr and "UserError" in out.stderr
