"""What `r3rag run FILE` builds: a plain pipeline, an experiment (variants + table), or one slice of
an experiment (`--slice NAME`). This module dispatches; r3rag.experiments.pipeline,
r3rag.experiments.experiment and r3rag.experiments.slices.file do the work, and the slices
(r3rag.experiments.slices.cut) come after the experiment they cut, never before.

Usage:
    run_file(Path("pipelines/replicate.yaml"), [], runs_dir=None)   # a plain pipeline or an experiment
    plan_file(Path("pipelines/demo.yaml"), [], runs_dir=None)       # `r3rag run --dry-run`
"""

from __future__ import annotations

from pathlib import Path

from r3rag.core.artifacts import ArtifactRef
from r3rag.experiments.experiment import plan_experiment, run_experiment
from r3rag.experiments.pipeline import is_experiment, load_pipeline, plan_pipeline, run_pipeline
from r3rag.util.errors import UserError


def run_file(
    path: Path, overrides: list[str], runs_dir: Path | None, slice_name: str | None = None, commit: bool = False
) -> ArtifactRef:
    """`r3rag run`: an experiment (variants + table), one of its slices (`--slice`, r3rag.experiments.slices.cut),
    or else a plain pipeline."""
    data = load_pipeline(path)
    if is_experiment(data):
        from r3rag.experiments.slices.cut import load_slices, pick

        experiment, slices = load_slices(path, data)  # checked on every run: a typo fails before hours of work
        if slice_name is None:
            return run_experiment(path, experiment, overrides, runs_dir)
        from r3rag.experiments.slices.file import run_slice

        return run_slice(path, experiment, pick(path, slices, slice_name), overrides, runs_dir, commit)
    _no_slice(path, slice_name)
    return run_pipeline(path, overrides, runs_dir, data=data)


def plan_file(path: Path, overrides: list[str], runs_dir: Path | None, slice_name: str | None = None) -> list[dict]:
    """`r3rag run --dry-run`: the plan of an experiment, of one of its slices, or of a plain pipeline."""
    data = load_pipeline(path)
    if is_experiment(data):
        from r3rag.experiments.slices.cut import load_slices, pick, slice_experiment

        experiment, slices = load_slices(path, data)
        if slice_name is not None:
            experiment = slice_experiment(path, experiment, pick(path, slices, slice_name))
        return plan_experiment(path, experiment, overrides, runs_dir)
    _no_slice(path, slice_name)
    return plan_pipeline(path, overrides, runs_dir, data=data)


def _no_slice(path: Path, slice_name: str | None) -> None:
    if slice_name is not None:
        raise UserError(f"{path}: --slice: a plain pipeline has no slices (an experiment declares them)")
