"""Crash safety: a stage killed at any moment, or a disk that fills up, never leaves anything that
is listed as an artifact, and running again completes.

- SIGKILL inside ArtifactWriter.commit at each of its steps (a child process kills itself).
- SIGKILL of `r3rag index` and `r3rag sft` at seeded random moments while they write (slow):
  a watcher lists the runs dir all along and verifies every listed artifact against its manifest.
- Disk full: an injected ENOSPC at every point of a stage's writes, and a real tiny tmpfs when
  this machine lets us mount one.
(Resuming: synthesis killed and rerun without duplicates is tests/test_synthesize.py, RL resume from its
last checkpoint is tests/test_rl.py.)
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from r3rag.core.artifacts import ArtifactWriter, list_artifacts, resolve
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import TINY_WORLD, build_teacher_data

SFT_TINY = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "epochs=1", "batch_size=16", "lr=1e-2", "bf16=false"]


def assert_listing_valid(runs: Path) -> list:
    """Every listed artifact is complete: its files hash to what its manifest says."""
    refs = list_artifacts(runs)
    for ref in refs:
        resolve(str(ref.path), ref.stage, runs, verify=True)  # raises on a corrupt artifact
    return refs


def entries(runs: Path, stage: str) -> list[str]:
    return sorted(p.name for p in (runs / stage).glob("*")) if (runs / stage).is_dir() else []


# ------------------------------------------------------------------ kill inside commit, step by step

CHILD = r"""
import os, signal, sys
from pathlib import Path
import r3rag.core.artifacts as a

runs, kill_at = Path(sys.argv[1]), int(sys.argv[2])
calls = {"n": 0}
real_replace, real_hash = os.replace, a.hash_tree

def step():
    calls["n"] += 1
    if calls["n"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

def replace(src, dst):
    step(); real_replace(src, dst); step()

def hash_tree(root):
    step(); return real_hash(root)

os.replace, a.hash_tree = replace, hash_tree
with a.ArtifactWriter("index", "k", {"x": 1}, {}, runs) as w:
    step()
    (w.dir / "big.bin").write_bytes(b"x" * 100_000)
    step()
print("completed", calls["n"])
"""


def test_kill_at_every_step_of_commit(tmp_path):
    runs = tmp_path / "runs"
    # kill points: in the body, before/after hashing, around the manifest rename, around the directory rename
    finished = subprocess.run([sys.executable, "-c", CHILD, str(runs), "0"], capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr
    n_steps = int(finished.stdout.split()[-1])
    assert n_steps == 7
    shutil.rmtree(runs)
    for kill_at in range(1, n_steps + 1):
        out = subprocess.run([sys.executable, "-c", CHILD, str(runs), str(kill_at)], capture_output=True, text=True)
        assert out.returncode == -signal.SIGKILL
        refs = assert_listing_valid(runs)
        published = kill_at >= 7  # the kill came after the directory rename
        assert len(refs) == int(published), (kill_at, entries(runs, "index"))
        # a rerun completes (or reuses the published artifact) and cleans the dead run's temp dir
        w = ArtifactWriter("index", "k", {"x": 1}, {}, runs)
        if not w.existing:
            with w:
                (w.dir / "big.bin").write_bytes(b"x" * 100_000)
        assert [r.id for r in assert_listing_valid(runs)] == [w.id]
        assert entries(runs, "index") == [w.id], f"kill at {kill_at} left {entries(runs, 'index')}"
        shutil.rmtree(runs)


# ------------------------------------------------------------------ SIGKILL real stages


class Watcher(threading.Thread):
    """Lists the runs dir in a loop while a stage runs; records any listed artifact that fails to verify."""

    def __init__(self, runs: Path):
        super().__init__(daemon=True)
        self.runs, self.stop, self.errors, self.listings = runs, threading.Event(), [], 0

    def run(self):
        while not self.stop.is_set():
            try:
                assert_listing_valid(self.runs)
                self.listings += 1
            except Exception as e:  # noqa: BLE001 - any failure to verify a listed artifact counts
                self.errors.append(repr(e))
            time.sleep(0.005)


def kill_rounds(cmd: list[str], runs: Path, stage: str, delays: list[float]) -> dict:
    """Start `cmd`, wait until its temp dir appears, SIGKILL it `delay` seconds later; per delay."""
    watcher = Watcher(runs)
    watcher.start()
    outcomes = []
    try:
        for delay in delays:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while proc.poll() is None and not any(n.startswith(".tmp-") for n in entries(runs, stage)):
                time.sleep(0.002)
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
            published = [r for r in assert_listing_valid(runs) if r.stage == stage]
            outcomes.append("killed" if rc == -signal.SIGKILL and not published else f"finished rc={rc}")
            for ref in published:  # it finished before the kill: start the next round from scratch
                shutil.rmtree(ref.path)
        rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        watcher.stop.set()
        watcher.join()
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert not watcher.errors, watcher.errors[:3]
    assert watcher.listings > 10
    final = [r for r in assert_listing_valid(runs) if r.stage == stage]
    assert len(final) == 1 and entries(runs, stage) == [final[0].id]  # the dead runs' temp dirs are gone
    return {"outcomes": outcomes, "ref": final[0]}


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "r3rag.cli", *args]


@pytest.mark.slow  # kills the index stage at random points, a fresh interpreter each: ~6 s (2 AVX2 cores)
def test_sigkill_index_at_random_points(tmp_path):
    rng = random.Random(8)
    corpus = tmp_path / "corpus.jsonl"
    words = [f"w{i}" for i in range(5000)]
    with open(corpus, "w") as f:  # big enough that building and saving take about a second
        for i in range(40_000):
            f.write(json.dumps({"id": str(i), "title": f"t{i}", "text": " ".join(rng.choices(words, k=30))}) + "\n")
    runs = tmp_path / "runs"
    cmd = cli("index", "--runs-dir", str(runs), "--set", f"corpus={corpus}", "--set", "world=")
    result = kill_rounds(cmd, runs, "index", [rng.uniform(0, 1.5) for _ in range(3)])
    assert result["outcomes"].count("killed") >= 2, result["outcomes"]
    assert result["ref"].manifest["metrics"]["docs"] == 40_000


@pytest.mark.slow  # kills SFT at random points, a fresh interpreter importing torch each: ~32 s (2 AVX2 cores)
def test_sigkill_sft_at_random_points(tmp_path):

    rng = random.Random(8)
    runs = tmp_path / "runs"
    build_teacher_data(runs)
    cmd = cli("sft", "--runs-dir", str(runs), *[a for s in SFT_TINY for a in ("--set", s)])
    result = kill_rounds(cmd, runs, "sft", [rng.uniform(0, 3.0) for _ in range(2)])  # training takes ~4 s here
    assert "killed" in result["outcomes"], result["outcomes"]
    assert (result["ref"].path / "model" / "config.json").is_file()


# ------------------------------------------------------------------ disk full


class FullDisk:
    """Files opened for writing under `root` raise ENOSPC once `quota` bytes were written in all
    (as a real disk does: from inside write()). Covers everything written from Python."""

    def __init__(self, root: Path, quota: int):
        self.root, self.quota, self.written = str(root), quota, 0

    def install(self, monkeypatch):
        real_open = io.open

        def fake_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if isinstance(file, (str, Path)) and str(file).startswith(self.root) and set(mode) & set("wax+"):
                return _Metered(f, self, str(file))
            return f

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(io, "open", fake_open)


class _Metered:
    def __init__(self, f, disk: FullDisk, name: str):
        self._f, self._disk, self._name = f, disk, name

    def write(self, data):
        size = len(data.encode() if isinstance(data, str) else data)
        if self._disk.written + size > self._disk.quota:
            raise OSError(errno.ENOSPC, "No space left on device", self._name)
        self._disk.written += size
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


WORLD_ARGS = [a for k, v in TINY_WORLD.items() for a in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def world_sizes(tmp_path_factory):
    """Bytes of each file the world stage writes, in the order it writes them."""
    runs = tmp_path_factory.mktemp("sizes")
    assert r3rag_inprocess("world", "--runs-dir", runs, *WORLD_ARGS).returncode == 0
    path = list_artifacts(runs)[0].path
    names = ["corpus.jsonl", "train.jsonl", "test.jsonl", "vocab.txt", "config.yaml"]
    return {n: (path / n).stat().st_size for n in names}


@pytest.mark.parametrize("full_in", ["corpus.jsonl", "train.jsonl", "vocab.txt", "config.yaml", "manifest.json"])
def test_disk_full_while_writing_an_artifact(tmp_path, monkeypatch, world_sizes, full_in):
    """The disk fills up inside each file the world stage writes, the manifest last."""
    before = 0
    for name, size in world_sizes.items():
        if name == full_in:
            break
        before += size
    runs = tmp_path / "runs"
    FullDisk(runs, before + 10).install(monkeypatch)
    args = ["world", "--runs-dir", runs, *WORLD_ARGS]
    out = r3rag_inprocess(*args)
    assert_one_line_error(out, "No space left on device", str(runs / "world"), full_in, "nothing was published")
    assert list_artifacts(runs) == [] and entries(runs, "world") == []
    monkeypatch.undo()  # space again: the same command completes
    out = r3rag_inprocess(*args)
    assert out.returncode == 0, out.stderr
    assert len(assert_listing_valid(runs)) == 1


def test_disk_full_in_import(tmp_path, monkeypatch):
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    out_dir = tmp_path / "out"
    FullDisk(out_dir, 10).install(monkeypatch)
    out = r3rag_inprocess("import", src, "--out", out_dir / "q.jsonl")
    assert_one_line_error(out, "No space left on device", str(out_dir))
    assert not list(out_dir.glob("*"))


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 96 KB tmpfs, where this machine allows mounting one (root in a container); else skip."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_real_full_tmpfs(tiny_tmpfs):
    runs = tiny_tmpfs / "runs"
    args = ["world", "--runs-dir", runs, *WORLD_ARGS]
    out = r3rag_inprocess(*args)
    assert_one_line_error(out, "No space left on device", str(runs / "world"), "nothing was published")
    assert list_artifacts(runs) == [] and entries(runs, "world") == []
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_tmpfs)], check=True)
    assert r3rag_inprocess(*args).returncode == 0
    assert len(assert_listing_valid(runs)) == 1
