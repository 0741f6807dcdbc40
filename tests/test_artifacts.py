"""Artifacts: temp dir + rename, manifest last, skip on same config, content hash checked."""

import json

import pytest

from r3rag.core.artifacts import ArtifactWriter, list_artifacts, resolve
from r3rag.util.errors import UserError


def _write(runs, config, text="hello"):
    w = ArtifactWriter("world", "t", config, {}, runs, seed=1)
    if w.existing:
        return w.existing
    with w:
        (w.dir / "out.txt").write_text(text)
        w.metrics["n"] = 1
    return w.ref


def test_commit_writes_manifest_and_outputs(tmp_path):
    ref = _write(tmp_path, {"a": 1})
    m = json.loads((ref.path / "manifest.json").read_text())
    assert m["stage"] == "world" and m["config"] == {"a": 1} and m["metrics"] == {"n": 1}
    assert set(m["outputs"]) == {"out.txt", "config.yaml"} and m["seed"] == 1
    assert "torch" in m["libraries"] and m["seconds"] >= 0
    assert not [p for p in ref.path.parent.iterdir() if p.name.startswith(".tmp")]


def test_same_config_reuses_and_new_config_writes(tmp_path):
    a = _write(tmp_path, {"a": 1})
    assert _write(tmp_path, {"a": 1}).path == a.path
    b = _write(tmp_path, {"a": 2})
    assert b.path != a.path and len(list_artifacts(tmp_path, "world")) == 2


def test_failure_leaves_nothing_that_looks_complete(tmp_path):
    w = ArtifactWriter("world", "t", {"a": 3}, {}, tmp_path)
    with pytest.raises(RuntimeError):
        with w:
            (w.dir / "half.txt").write_text("x")
            raise RuntimeError("killed")
    assert not (tmp_path / "world").exists() or not any((tmp_path / "world").iterdir())
    assert list_artifacts(tmp_path) == []


def test_directory_without_manifest_is_ignored(tmp_path):
    (tmp_path / "world" / "t-123").mkdir(parents=True)
    assert list_artifacts(tmp_path) == []
    with pytest.raises(UserError, match="no complete world artifact"):
        resolve("world:latest", "world", tmp_path)


def test_resolve_checks_stage_and_content_hash(tmp_path):
    ref = _write(tmp_path, {"a": 1})
    assert resolve("world:latest", "world", tmp_path).path == ref.path
    assert resolve(str(ref.path), "world", tmp_path).id == ref.id
    with pytest.raises(UserError, match="is a 'world' artifact, expected 'index'"):
        resolve(str(ref.path), "index", tmp_path)
    (ref.path / "out.txt").write_text("tampered")
    with pytest.raises(UserError, match="content hash does not match"):
        resolve(str(ref.path), "world", tmp_path)
