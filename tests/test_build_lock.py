"""Two r3rag processes on one runs dir build each artifact once (r3rag.core.build_lock), and
`r3rag run --jobs N` builds an experiment's variants in N workers (r3rag.experiments.jobs)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from r3rag.core.build_lock import ArtifactBusy, BuildLock
from r3rag.experiments.pipeline import run_stage
from r3rag.experiments.status.stages import status_file
from r3rag.stages.common import NotBuilt
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import TINY_WORLD

WORLD = [f"{k}={v}" for k, v in TINY_WORLD.items()]

# Another process builds the same world, holding its lock for 3 s before it publishes.
SLOW_BUILDER = textwrap.dedent(
    """
    import sys, time
    from r3rag.core import artifacts
    from r3rag.experiments.pipeline import run_stage
    enter = artifacts.ArtifactWriter.__enter__
    def slow_enter(self):
        print("locked", flush=True)
        time.sleep(3)
        return enter(self)
    artifacts.ArtifactWriter.__enter__ = slow_enter
    run_stage("world", None, sys.argv[2:], sys.argv[1])
    """
)


def _world_final(runs: Path) -> Path:
    with pytest.raises(NotBuilt) as missing:
        run_stage("world", None, WORLD, runs, status_only=True)
    return missing.value.final


def _start_slow_builder(runs: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILDER, str(runs), *WORLD], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_busy_artifact_is_waited_for_and_reused_or_set_aside(tmp_path, capsys):
    runs = tmp_path / "runs"
    final = _world_final(runs)
    builder = _start_slow_builder(runs)
    assert BuildLock(final).held_elsewhere()
    pipeline = tmp_path / "p.yaml"  # the same world as a pipeline file: `run --status` sees it being built
    pipeline.write_text(yaml.safe_dump({"name": "default", "world": TINY_WORLD}))
    assert status_file(pipeline, [], runs) == [
        {"stage": "world", "state": "in progress", "detail": f"building now, {final.name}"}
    ]
    with pytest.raises(ArtifactBusy):  # a --jobs worker: told at once, builds something else meanwhile
        run_stage("world", None, WORLD, runs, busy="skip")
    t0 = time.time()
    ref = run_stage("world", None, WORLD, runs)  # a plain command waits, then reuses what was published
    assert builder.wait(timeout=60) == 0 and time.time() - t0 > 1.0
    assert ref.path == final and "reusing" in capsys.readouterr().err
    assert not BuildLock(final).held_elsewhere()
    assert list(final.parent.iterdir()) == [final]  # no lock file left behind


def test_a_killed_builder_leaves_no_lock(tmp_path):
    runs = tmp_path / "runs"
    final = _world_final(runs)
    builder = _start_slow_builder(runs)
    builder.kill()
    builder.wait(timeout=60)
    assert not BuildLock(final).held_elsewhere()  # the kernel dropped it with the process
    assert run_stage("world", None, WORLD, runs, busy="skip").path == final  # built here, not refused


def test_a_jobs_workers_thread_cap_holds(monkeypatch):
    import torch

    from r3rag.stages.common import set_threads

    before = torch.get_num_threads()
    monkeypatch.setenv("R3RAG_THREADS", "1")
    try:
        set_threads(2)
        assert torch.get_num_threads() == 1
        set_threads(0)  # torch's default would be every core
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_jobs_need_an_experiment(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump({"name": "plain", "world": TINY_WORLD}))
    out = r3rag_inprocess("run", path, "--jobs", "2", "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, "--jobs", "plain pipeline")


def test_jobs_build_each_artifact_once_and_write_the_table(tmp_path):
    """Two workers, two seeds of a cold start and a reader: every artifact is published once (by
    either worker), the table is written after them, and each manifest says it shared the machine."""
    from tests.test_experiment import _experiment

    sft_only = ["eval.rl=", "eval.systems=[sft]"]
    path = _experiment(
        tmp_path,
        seeds={"values": [0, 1], "set": ["sft.seed={seed}"]},
        variants={
            "cold": {"stages": ["world", "index", "synthesize", "sft", "eval"], "set": sft_only},
            "more": {"stages": ["world", "index", "synthesize", "sft", "eval"], "set": ["sft.epochs=2", *sft_only]},
        },
        table={"SFT": "cold/sft", "SFT, 2 epochs": "more/sft"},
    )
    runs = tmp_path / "runs"
    out = subprocess.run(
        [sys.executable, "-m", "r3rag.cli", "run", str(path), "--jobs", "2", "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    table = json.loads((Path(out.stdout.strip().splitlines()[-1]) / "table.json").read_text())
    assert [r["n_seeds"] for r in table["rows"]] == [2, 2]
    logs = sorted((runs / ".jobs").glob("*.log"))
    wrote = [
        ln.split(": wrote ")[1].split(" (")[0]
        for log in logs
        for ln in log.read_text().splitlines()
        if ": wrote " in ln
    ]
    published = [
        d
        for stage in ("world", "index", "synthesize", "sft", "eval")
        for d in (runs / stage).iterdir()
        if not d.name.startswith(".")
    ]
    assert len(logs) == 2 and sorted(wrote) == sorted(str(d) for d in published)  # each built once
    assert len([d for d in published if d.parent.name == "sft"]) == 4  # 2 variants x 2 seeds
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    for d in published:
        assert json.loads((d / "manifest.json").read_text())["compute"]["jobs"] == 2
    sft = json.loads((next(d for d in published if d.parent.name == "sft") / "manifest.json").read_text())
    assert sft["compute"] == {"jobs": 2, "threads": threads}


def _workers_of(runs: Path) -> list[int]:
    """Live `--worker` processes building in `runs` (from /proc: no extra library)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--worker" in cmd and str(runs).encode() in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_run_jobs_stops_its_workers(tmp_path, sig):
    """`kill` of `run --jobs` (SIGTERM: it stops them; SIGKILL: the kernel tells them) leaves no
    worker training on unwatched."""
    from tests.test_experiment import _experiment

    path, runs = _experiment(tmp_path), tmp_path / "runs"
    parent = subprocess.Popen(
        [sys.executable, "-m", "r3rag.cli", "run", str(path), "--jobs", "2", "--runs-dir", str(runs)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while len(_workers_of(runs)) < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert len(_workers_of(runs)) == 2
    parent.send_signal(sig)
    assert parent.wait(timeout=60) != 0
    deadline = time.time() + 30
    while _workers_of(runs) and time.time() < deadline:
        time.sleep(0.2)
    assert _workers_of(runs) == []
