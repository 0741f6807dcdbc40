"""`r3rag run EXPERIMENT --jobs N`: N worker processes build one experiment's artifacts at once.

An experiment's variants and seeds (the replication's readers, controls and three seeds) are
mostly independent, and one stage rarely uses a machine well: a tiny model's generation leaves
cores idle between small matrix products, a 7B model leaves the other GPUs idle. Each worker is
`r3rag run FILE --worker`, with R3RAG_THREADS = cores / N (the cap r3rag.stages.common.set_threads
honours) and, where CUDA_VISIBLE_DEVICES lists at least N devices, its share of them. A worker
goes through the variants in the file's order; where another worker holds a stage's build lock
(r3rag.core.build_lock), it sets that variant aside and builds the next one meanwhile
(r3rag.experiments.experiment.build_variants). When all are done, this process runs the experiment once
more as a plain `r3rag run`: every artifact is reused, and the table and results file are written.
Each worker's output goes to runs/.jobs/<name>-<i>.log; this process prints what they publish.
Every artifact's manifest says how it was built (`compute`: threads, jobs): its seconds are the
wall time of a run that shared the machine.

Measured on 2 AVX2 cores with the replication's cold start (benchmarks/parallel_jobs.py,
2026-12-02): two 1-thread processes did 1.61x the eval generation of one 2-thread process, and
1.45x its SFT training.

Usage:
    r3rag run pipelines/replicate.yaml --jobs 2
    r3rag run pipelines/replicate.yaml --jobs 2 --slice w1-grpo-s0   # one slice's variants, then its file
    run_jobs(Path("pipelines/replicate.yaml"), [], runs_dir=None, jobs=2)
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from r3rag.core.artifacts import ArtifactRef, default_runs_dir
from r3rag.experiments.experiment import build_variants, check_overrides, parse_variants
from r3rag.experiments.pipeline import is_experiment, load_pipeline
from r3rag.experiments.run import run_file
from r3rag.util.errors import UserError

PR_SET_PDEATHSIG = 1  # linux/prctl.h
SHOWN = (": wrote ", "Error", "error:")  # worker log lines worth repeating here


def run_jobs(
    path: Path, overrides: list[str], runs_dir: Path | None, jobs: int, slice_name: str | None = None, commit=False
) -> ArtifactRef:
    """Build the experiment (or one of its slices) with `jobs` workers, then write its table and
    results file (or the slice's file) here."""
    data = _experiment(path, overrides, slice_name)
    runs_dir = Path(runs_dir) if runs_dir else default_runs_dir()
    logs = runs_dir / ".jobs"
    logs.mkdir(parents=True, exist_ok=True)
    workers = [
        _start(path, overrides, runs_dir, i, jobs, logs / f"{data.get('name', 'experiment')}-{i}.log", slice_name)
        for i in range(jobs)
    ]
    print(f"run --jobs {jobs}: workers' output in {logs}", file=sys.stderr)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` of this process stops the workers too
    try:
        failed = _watch(workers)
    except KeyboardInterrupt:  # the workers stop too; their checkpoints and journals stay for a rerun
        for proc, _, _ in workers:
            proc.terminate()
        for proc, _, _ in workers:
            proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        raise UserError(failed[0])
    return run_file(path, overrides, runs_dir, slice_name, commit)  # everything reused: the table and results file


def work(path: Path, overrides: list[str], runs_dir: Path | None, slice_name: str | None = None) -> None:
    """A worker (`r3rag run FILE --worker`): build every variant (of the slice), setting busy ones aside."""
    from rich.console import Console

    data = _experiment(path, overrides, slice_name)
    build_variants(path, data, parse_variants(path, data), overrides, runs_dir, Console(stderr=True), busy="skip")


def _experiment(path: Path, overrides: list[str], slice_name: str | None = None) -> dict:
    from r3rag.experiments.slices.cut import check_overrides as check_slice
    from r3rag.experiments.slices.cut import load_slices, pick, slice_experiment

    data = load_pipeline(path)
    if not is_experiment(data):
        raise UserError(
            f"{path}: --jobs: a plain pipeline's stages each need the one before; "
            "--jobs runs an experiment's variants side by side"
        )
    data, slices = load_slices(path, data)
    if slice_name is not None:
        sl = pick(path, slices, slice_name)
        data = slice_experiment(path, data, sl)
        check_slice(path, data, sl, overrides)  # before N workers train, not when they are done
    check_overrides(overrides, parse_variants(path, data))  # a typo fails here, not in N workers
    return data


def _start(path: Path, overrides: list[str], runs_dir: Path, i: int, jobs: int, log: Path, slice_name=None):
    cmd = [sys.executable, "-m", "r3rag.cli", "run", str(path), "--worker", "--runs-dir", str(runs_dir)]
    cmd += ["--slice", slice_name] if slice_name else []
    cmd += [arg for item in overrides for arg in ("--set", item)]
    handle = open(log, "w")  # noqa: SIM115 - the worker writes it until it exits; closed in _watch
    proc = subprocess.Popen(
        cmd, stdout=handle, stderr=subprocess.STDOUT, env=worker_env(i, jobs), preexec_fn=_die_with_parent
    )
    return proc, log, handle


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    """In a worker, before it starts (Linux): SIGTERM when the `run --jobs` process dies, even by
    SIGKILL, so no worker trains on unwatched."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the parent's own handlers still stop them
        pass


def worker_env(i: int, jobs: int) -> dict[str, str]:
    """Worker i's environment: its share of the CPU threads (and of the listed GPUs)."""
    threads = str(max(1, len(os.sched_getaffinity(0)) // jobs))
    env = {**os.environ, "R3RAG_THREADS": threads, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    env.update(R3RAG_JOBS=str(jobs), TOKENIZERS_PARALLELISM="false", COLUMNS="200")  # COLUMNS: unwrapped log lines
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if len(gpus) >= jobs:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i::jobs])
    return env


def _watch(workers: list, poll: float = 2.0) -> list[str]:
    """Repeat the workers' notable lines until all exit; the failures, one line each."""
    readers = [open(log, "rb") for _, log, _ in workers]  # noqa: SIM115 - closed below
    failed, running = [], set(range(len(workers)))
    try:
        while running:
            time.sleep(poll)
            for i, (proc, log, handle) in enumerate(workers):
                exited = i in running and proc.poll() is not None
                for line in _new_lines(readers[i], whole=exited):
                    if any(mark in line for mark in SHOWN):
                        print(f"[worker {i}] {line.strip()}", file=sys.stderr)
                if exited:
                    running.discard(i)
                    handle.close()
                    if proc.returncode:
                        failed.append(
                            f"run --jobs: worker {i} failed (exit {proc.returncode}): {_last_line(log)} (log: {log})"
                        )
                        if running:  # said now, while the others go on; the command's error says it at the end
                            print(failed[-1], file=sys.stderr)
    finally:
        for reader in readers:
            reader.close()
    return failed


def _new_lines(reader, whole: bool) -> list[str]:
    """The complete lines written since the last call (and an unfinished last one, when `whole`)."""
    start = reader.tell()
    data = reader.read()
    kept = data if whole else data[: data.rfind(b"\n") + 1]  # rfind -1: nothing complete yet
    reader.seek(start + len(kept))
    return kept.decode(errors="replace").splitlines()


def _last_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
