"""`r3rag run`: a pipeline, an experiment, or one slice of an experiment; --dry-run, --status, --jobs.

Usage:
    r3rag run pipelines/demo.yaml --set world.seed=7
    r3rag run pipelines/replicate.yaml --slice w1-grpo-s0 [--commit]
    r3rag run pipelines/replicate.yaml --status

Like r3rag.cli.commands, it imports what it runs inside its body, so that `--help` stays fast (r3rag.cli).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from r3rag.cli.base import DebugOpt, RunsOpt, SetOpt, guard
from r3rag.util.errors import UserError


def run_cmd(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML (e.g. pipelines/demo.yaml).")],
    set_: SetOpt = None,
    runs_dir: RunsOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate the whole config and print the plan; load and write nothing.")
    ] = False,
    status: Annotated[
        bool,
        typer.Option(
            "--status",
            help="Say which stages are done, in progress or left (an experiment with slices: which slices); build nothing.",
        ),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs",
            min=1,
            help="An experiment's variants and seeds built by this many worker processes at once, "
            "each with its share of the CPU threads (and of CUDA_VISIBLE_DEVICES).",
        ),
    ] = 1,
    slice_: Annotated[
        str | None,
        typer.Option(
            "--slice",
            help="Only this slice of an experiment (its `slices` section): build it, write its results file "
            "(results/<name>/<slice>.json) and print the git command that commits it. With --status: its stages here.",
        ),
    ] = None,
    commit: Annotated[
        bool, typer.Option("--commit", help="With --slice: commit the slice's file (that file only) when written.")
    ] = False,
    worker: Annotated[bool, typer.Option("--worker", hidden=True, help="One of --jobs' workers.")] = False,
    debug: DebugOpt = False,
):
    """Run a pipeline's stages in order, reusing any artifact that already exists for the same config and inputs.

    Overrides name the stage: --set world.seed=7 --set sft.epochs=2. The last line printed is
    the path of the final artifact. --dry-run checks every stage's config and prints the plan
    (inputs and non-default settings per stage) without loading data or weights. --status
    looks up each stage's artifact (per variant and seed of an experiment): done, in progress
    (an SFT or RL run with a checkpoint, a synthesize or eval with a journal: a rerun resumes
    it), to do, or waiting for its inputs; for an experiment it then prints its table over the
    seeds finished so far. --jobs N builds an experiment's variants in N worker processes
    (their output in RUNS/.jobs/), then writes its table; two commands that reach the same
    artifact build it once (the second waits for it, or a worker builds something else meanwhile).
    An experiment with `slices` runs one at a time with --slice NAME; its --status lists the
    slices committed, written, stale and missing, the hours of build left and the table over the
    slice files there are (`r3rag report --results` merges them).
    """

    def go():
        from r3rag.experiments.pipeline import print_plan
        from r3rag.experiments.run import plan_file, run_file

        if commit and slice_ is None:
            raise UserError("run: --commit commits a slice's file: it needs --slice NAME")
        if status:
            return _status(pipeline, list(set_ or []), runs_dir, slice_)
        if dry_run:
            print_plan(plan_file(pipeline, list(set_ or []), runs_dir, slice_), pipeline)
            print("dry run: the config is valid")
            return
        if worker:
            from r3rag.experiments.jobs import work

            return work(pipeline, list(set_ or []), runs_dir, slice_)
        if jobs > 1:
            from r3rag.experiments.jobs import run_jobs

            ref = run_jobs(pipeline, list(set_ or []), runs_dir, jobs, slice_, commit)
        else:
            ref = run_file(pipeline, list(set_ or []), runs_dir, slice_, commit)
        print(ref.path)

    guard(go, debug)


def _status(pipeline: Path, overrides: list[str], runs_dir: Path | None, slice_name: str | None) -> None:
    """--status: a sliced experiment's slices (from their files), else the stages in the runs directory."""
    from r3rag.experiments.pipeline import load_pipeline

    data = load_pipeline(pipeline)
    if data.get("slices") and slice_name is None:
        from r3rag.experiments.status.slices import print_slice_status

        return print_slice_status(pipeline, data)
    from r3rag.experiments.status.so_far import print_so_far
    from r3rag.experiments.status.stages import file_status, print_status

    rows, built, experiment = file_status(pipeline, overrides, runs_dir, slice_name)
    print_status(rows, pipeline)
    if experiment:
        print_so_far(pipeline, experiment, built)
