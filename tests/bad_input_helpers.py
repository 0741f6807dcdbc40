"""What the bad-input tests share (tests/test_bad_input.py: files and artifacts; tests/test_bad_settings.py:
settings and pipeline files): a runs dir to break things in, and `check`, which holds a failed
command to one line `error: ...` naming what is wrong, no traceback, and nothing new in runs/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from r3rag.core.artifacts import ArtifactWriter, list_artifacts
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import build_teacher_data

BIG = 10 * 1024 * 1024  # the "10 MB single line"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A runs dir with real world, index and synthesize artifacts and small fake sft/eval ones
    (resolving an input only reads its manifest and hashes its files: no training needed)."""

    runs = tmp_path_factory.mktemp("base") / "runs"
    build_teacher_data(runs)
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


def _snapshot(runs: Path) -> set[str]:
    """Everything in the runs dir: stage folders (even empty ones), artifacts and any (hidden) temp
    directories."""
    return {p.relative_to(runs).as_posix() for p in [*runs.glob("*"), *runs.glob("*/*")]}


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
