"""`r3rag run FILE --status`: how far a pipeline or an experiment has got, building nothing.

Each stage's artifact id is computed as a run would compute it (its config and its inputs'
content), and looked up: `done` (published), `in progress` (an SFT or RL run's work folder holds
a checkpoint, or a synthesize or eval run's journal: a rerun resumes from it; "building now"
where a running process holds its build lock, r3rag.core.build_lock), `to do` (the next
stage to run), `waiting` (its inputs are not built yet, so its id is not known). A multi-day
experiment (pipelines/replicate.yaml, three seeds a variant, resumed across sessions) shows what
is left without starting it, and
`time_left` estimates how long that is: each left stage of variant V at one seed takes what V's
same stage took at another seed (its manifest's seconds), a checkpointed one the part still to
run, and one that another variant builds too (the same artifact at the seeds that finished)
nothing; a stage V has not run at any seed yet takes, roughly, what that stage took in the other
variants.

An experiment with slices (r3rag.experiments.slices.cut) shows its slices instead
(r3rag.experiments.status.slices); with `--slice NAME`, this view of that slice's stages on this
machine.

Usage:
    r3rag run pipelines/demo.yaml --status
    r3rag run pipelines/replicate.yaml --status --slice w1-grpo-s0   # one slice's stages here
    rows = status_file(Path("pipelines/replicate.yaml"), [], runs_dir=None)
    rows, built, experiment = file_status(Path("pipelines/replicate.yaml"), [], runs_dir=None)
"""

from __future__ import annotations

import statistics
from pathlib import Path

from r3rag.core.artifacts import built_seconds, journal_file, work_dir
from r3rag.core.build_lock import BuildLock
from r3rag.experiments.experiment import parse_variants, variant_overrides
from r3rag.experiments.pipeline import is_experiment, load_pipeline, pipeline_stages, run_stage, split_overrides
from r3rag.stages.common import NotBuilt
from r3rag.training.checkpoints import last_complete_checkpoint, planned_steps, step_of
from r3rag.util.errors import UserError


def status_file(path: Path, overrides: list[str], runs_dir: Path | None) -> list[dict]:
    """One row per stage (per variant of an experiment): {"stage", "state", "detail"}."""
    return file_status(path, overrides, runs_dir)[0]


def file_status(
    path: Path, overrides: list[str], runs_dir: Path | None, slice_name: str | None = None
) -> tuple[list[dict], dict, dict | None]:
    """(rows as status_file's, each variant's done artifacts {variant: {stage: ref}}, the
    experiment with its seeds expanded, or one slice of it, r3rag.experiments.slices.cut); ({} and
    None for a plain pipeline)."""
    data = load_pipeline(path)
    if not is_experiment(data):
        if slice_name is not None:
            raise UserError(f"{path}: --slice: a plain pipeline has no slices (an experiment declares them)")
        stages = pipeline_stages(data, path)
        return _status_stages(path, data, stages, split_overrides(overrides, stages), runs_dir, {})[0], {}, None
    from r3rag.experiments.slices.cut import load_slices, pick, slice_experiment

    data, slices = load_slices(path, data)
    if slice_name is not None:
        data = slice_experiment(path, data, pick(path, slices, slice_name))
    rows, built = [], {}
    for name, spec in parse_variants(path, data).items():
        try:
            per_stage = variant_overrides(path, name, spec, overrides, built)
        except UserError:  # `${other.stage}` of a variant not built yet
            rows += [{"stage": f"{name}: {s}", "state": "waiting", "detail": ""} for s in spec["stages"]]
            continue
        stage_rows, built[name] = _status_stages(path, data, spec["stages"], per_stage, runs_dir, {})
        rows += [{**r, "stage": f"{name}: {r['stage']}"} for r in stage_rows]
    return rows, built, data


def _status_stages(path, data, stages, per_stage, runs_dir, bound) -> tuple[list[dict], dict]:
    rows = []
    for i, stage in enumerate(stages):
        try:
            bound[stage] = run_stage(stage, path, per_stage[stage], runs_dir, bound=bound, data=data, status_only=True)
        except NotBuilt as missing:
            rows.append({"stage": stage, **_unbuilt(missing)})
            rows += [{"stage": s, "state": "waiting", "detail": ""} for s in stages[i + 1 :]]
            return rows, bound
        rows.append(
            {
                "stage": stage,
                "state": "done",
                "detail": bound[stage].id,
                "seconds": built_seconds(bound[stage].manifest),
            }
        )
    return rows, bound


def _unbuilt(missing: NotBuilt) -> dict:
    """`to do`, or `in progress` where a killed SFT or RL run left checkpoints to resume from, or
    a killed synthesize or eval a journal of finished items (r3rag.util.journal); "building now" where
    a running r3rag process holds its build lock (r3rag.core.build_lock)."""
    now = "building now, " if BuildLock(missing.final).held_elsewhere() else ""
    last = last_complete_checkpoint(work_dir(missing.final) / "checkpoints")
    if last:
        done, planned = step_of(last), planned_steps(last)
        return {
            "state": "in progress",
            "detail": f"{now}checkpoint at step {done} of {planned}",
            "done_share": done / planned if planned else 0.0,
        }
    journal = journal_file(missing.final)
    if journal.is_file() and journal.stat().st_size:
        with open(journal, "rb") as f:
            lines = sum(1 for _ in f)
        return {"state": "in progress", "detail": f"{now}journal of {lines} finished items ({missing.id})"}
    if now:
        return {"state": "in progress", "detail": f"{now}{missing.id}"}
    return {"state": "to do", "detail": missing.id}


def time_left(rows: list[dict]) -> tuple[float, int, int]:
    """(seconds the stages not done should take, how many of them were timed roughly, how many
    have no estimate): each left stage by the same variant's same stage at the seeds where it is
    done (the median of their seconds), else, roughly, by that stage of every variant where done."""
    parsed = [(_parts(r["stage"]), r) for r in rows]
    first_builder: dict[tuple, str] = {}  # (seed, stage, artifact id) -> the first variant whose row has it
    for (variant, seed, stage), r in parsed:
        if r["state"] == "done":
            first_builder.setdefault((seed, stage, r["detail"]), variant)
    seconds, rough, unknown = 0.0, 0, 0
    for (variant, seed, stage), r in parsed:
        if r["state"] == "done":
            continue
        siblings = [  # (seed, row): this variant's same stage, done at another seed
            (sd, d) for (v, sd, st), d in parsed if (v, st) == (variant, stage) and sd != seed and d["state"] == "done"
        ]
        if any(first_builder[(sd, stage, d["detail"])] != variant for sd, d in siblings):
            continue  # another variant built it at those seeds: it does here too, and is counted there
        figures = [d["seconds"] for _, d in siblings if d.get("seconds") is not None]
        if not figures:  # e.g. a variant on another world, before its first seed finished
            figures = [d["seconds"] for (_, _, st), d in parsed if st == stage and d.get("seconds") is not None]
            rough += bool(figures)
        if not figures:
            unknown += 1
            continue
        seconds += statistics.median(figures) * (1 - r.get("done_share", 0.0))
    return seconds, rough, unknown


def _parts(row_stage: str) -> tuple[str, str, str]:
    """ "main#s1: sft" -> ("main", "s1", "sft"); "bm25: index" -> ("bm25", "", "index"); "sft" -> ("", "", "sft")."""
    name, _, stage = row_stage.rpartition(": ")
    variant, _, seed = name.partition("#")
    return variant, seed, stage


def print_states(title: str, key: str, rows: list[dict], style: dict[str, str]):
    """A `key | state | detail` table of `rows`, each state in its `style` colour: the stages of
    `run --status` and the slices of an experiment's. Returns the console and the count per state."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in (key, "state", "detail"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r[key], f"[{style[r['state']]}]{r['state']}[/]", r["detail"])
    console = Console()
    console.print(table)
    return console, {s: sum(r["state"] == s for r in rows) for s in style}


def print_status(rows: list[dict], path: Path) -> None:
    style = {"done": "green", "in progress": "yellow", "to do": "bold", "waiting": "dim"}
    console, counts = print_states(f"{path}: status", "stage", rows, style)
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()) + f" (of {len(rows)} stages)")
    if counts["done"] < len(rows):
        seconds, rough, unknown = time_left(rows)
        if unknown and not seconds:  # nothing to go by: "~0.0 h left" would mislead
            console.print("no estimate of the time left yet: no left stage has run anywhere")
            return
        # A sum of one stage after another: under `run --jobs N` the wall time is lower (~1.3-1.5x
        # on 2 cores, benchmarks/parallel_jobs.py), and times measured under --jobs run longer.
        guess = f"~{seconds / 3600:.1f} h of build time left (one stage at a time), by the same stages' times at other seeds"
        if rough:
            guess += f" ({rough} stages, not yet run at any seed, by other variants' same stage: rough)"
        console.print(guess + (f"; {unknown} stages have no figure at all (not counted)" if unknown else ""))
