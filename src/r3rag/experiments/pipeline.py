"""Running stages and pipelines from YAML.

A pipeline YAML has a top-level `name`, an optional `stages` list (default: every stage
section present, in pipeline order) and one section per stage. Within `run`, an input
written as `<stage>:latest` is bound to the artifact that stage produced in this run.
A pipeline with `variants` and a `table` is an experiment: r3rag.experiments.experiment runs it (above this
module: it calls `run_stages`; `r3rag run` goes through r3rag.experiments.run for both kinds).
`extends: other.yaml` starts from another pipeline file and changes some of its settings.

Usage:
    run_stage("sft", Path("pipelines/demo.yaml"), ["epochs=2"], runs_dir=None)
    run_pipeline(Path("pipelines/demo.yaml"), ["world.seed=7"])
    plan_pipeline(Path("pipelines/r3rag-qwen2.5-7b.yaml"), [])   # --dry-run: validate, print the plan
"""

from __future__ import annotations

import io
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from r3rag.core.artifacts import ArtifactRef, default_runs_dir, list_artifacts
from r3rag.stages import STAGE_ORDER, STAGES, stage_module
from r3rag.stages.common import FILE, Context
from r3rag.util.config import build_config, key_location, load_yaml, parse_overrides
from r3rag.util.errors import UserError

TOP_LEVEL = {"name", "extends", "stages", "variants", "table", "seeds", "compare", "results", "slices", *STAGE_ORDER}


def _load_pipeline(path: Path | None, _seen: tuple[Path, ...] = ()) -> dict:
    data = load_yaml(path) if path else {}
    unknown = sorted(set(data) - TOP_LEVEL, key=str)  # key=str: YAML keys may be numbers too
    if unknown:
        raise UserError(
            f"{key_location(path, unknown[0])}: unknown top-level key {unknown[0]!r} "
            f"(known: {', '.join(sorted(TOP_LEVEL))})"
        )
    if "extends" in data:
        data = _extend(path, data, _seen)
    return data


def _extend(path: Path, data: dict, seen: tuple[Path, ...]) -> dict:
    """`extends: other.yaml` (relative to this file): that pipeline with this file's settings on
    top. A stage section's keys replace the same keys of the base's section; `name`, `stages`,
    `variants`, `table`, `seeds`, `compare`, `results` and `slices` replace the base's whole."""
    base_path = (path.parent / str(data.pop("extends"))).resolve()
    seen = (*seen, path.resolve())  # the files of this chain so far
    if base_path in seen:
        raise UserError(f"{path}: extends: {base_path.name} extends itself")
    if not base_path.is_file():
        raise UserError(f"{path}: extends: no pipeline file {base_path}")
    merged = _load_pipeline(base_path, seen)
    for key, value in data.items():
        if key in STAGE_ORDER and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _section(data: dict, stage: str, path) -> dict:
    if not isinstance(data.get(stage) or {}, dict):
        raise UserError(f"{path}: section {stage!r} must be a mapping")
    section = dict(data.get(stage) or {})
    if "name" in data and "name" not in section:
        section["name"] = data["name"]
    return section


def run_stage(
    stage: str,
    config_path: Path | None,
    overrides: list[str],
    runs_dir: Path | None,
    bound: dict[str, ArtifactRef] | None = None,
    data: dict | None = None,
    status_only: bool = False,
    busy: str = "wait",
) -> ArtifactRef:
    module = stage_module(stage)
    data = data if data is not None else _load_pipeline(config_path)
    section = _section(data, stage, config_path)
    for field, src in module.INPUTS.items():  # bind "<stage>:latest" to this run's artifact
        if bound and src in bound and section.get(field, f"{src}:latest") == f"{src}:latest":
            section[field] = str(bound[src].path)
    if bound and "model" in bound:  # `model: model:latest` anywhere (sft.model, eval.models.X.model...)
        section = _bind_latest(section, "model", str(bound["model"].path))
    cfg = stage_config(stage, section, overrides, f"{config_path}: {stage}" if config_path else stage)
    ctx = Context(runs_dir=Path(runs_dir) if runs_dir else default_runs_dir(), status_only=status_only, busy=busy)
    if status_only:  # found or not: said in the status table, not on the console
        ctx.console = Console(file=io.StringIO())
    with ctx.tidy_on_failure():
        return module.run(cfg, ctx)


def stage_config(stage: str, section: dict, overrides: list[str], where: str):
    """A stage's typed config from its section and `--set` overrides, with the checks every stage
    shares (keys, types, Literal choices)."""
    return build_config(stage_module(stage).Config, section, parse_overrides(overrides), where=where)


def _bind_latest(value, stage: str, path: str):
    """`value` with every string `<stage>:latest` in it (nested too) replaced by `path`."""
    if isinstance(value, dict):
        return {k: _bind_latest(v, stage, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_bind_latest(v, stage, path) for v in value]
    return path if value == f"{stage}:latest" else value


def pipeline_stages(data: dict, path: Path) -> list[str]:
    """The stages a pipeline runs, in order: its `stages` list, else every stage section present."""
    stages = data.get("stages") or [s for s in STAGE_ORDER if s in data]
    if not stages:
        raise UserError(f"{path}: no stages (give a section per stage, e.g. `world: {{}}`, or a `stages` list)")
    bad = [s for s in stages if s not in STAGE_ORDER]
    if bad:
        raise UserError(f"{path}: unknown stage {bad[0]!r} in stages (known: {', '.join(STAGE_ORDER)})")
    return stages


def is_experiment(data: dict) -> bool:
    """A pipeline with `variants` or a `table` runs through r3rag.experiments.experiment."""
    return "variants" in data or "table" in data


def load_pipeline(path: Path) -> dict:
    """The pipeline file's settings, `extends` applied and its top-level keys checked."""
    return _load_pipeline(path)


def _plain(path: Path, data: dict | None) -> dict:
    data = _load_pipeline(path) if data is None else data
    if is_experiment(data):  # the experiment layer sits above this one and calls it, not the reverse
        raise UserError(
            f"{path}: has variants and a table: an experiment (run it with `r3rag run`, or r3rag.experiments.run.run_file)"
        )
    if "results" in data:  # a results file is an experiment's table as data: a plain pipeline has no table
        raise UserError(f"{path}: results: only an experiment (variants and a table) writes a results file")
    if data.get("slices"):  # slices divide an experiment's variants (r3rag.experiments.slices.cut)
        raise UserError(f"{path}: slices: only an experiment (variants and a table) runs in slices")
    return data


def run_pipeline(path: Path, overrides: list[str], runs_dir: Path | None, data: dict | None = None) -> ArtifactRef:
    """A plain pipeline (no variants): its stages in order; returns the last one's artifact.
    `r3rag run` takes experiments too (r3rag.experiments.run.run_file)."""
    data = _plain(path, data)
    stages = pipeline_stages(data, path)
    return run_stages(path, data, stages, split_overrides(overrides, stages), runs_dir)[stages[-1]]


def run_stages(
    path: Path,
    data: dict,
    stages: list[str],
    per_stage: dict[str, list[str]],
    runs_dir: Path | None,
    bound: dict[str, ArtifactRef] | None = None,
    busy: str = "wait",
) -> dict[str, ArtifactRef]:
    """Run `stages` in order; returns each stage's artifact (bound as the next ones' `:latest`).
    Stages already in `bound` are not run again; `bound` fills as they finish, so a caller that
    catches ArtifactBusy (busy="skip", r3rag.experiments.jobs) keeps what was done before it."""
    bound = {} if bound is None else bound
    for stage in stages:
        if stage not in bound:
            bound[stage] = run_stage(stage, path, per_stage[stage], runs_dir, bound=bound, data=data, busy=busy)
    return bound


def plan_pipeline(path: Path, overrides: list[str], runs_dir: Path | None, data: dict | None = None) -> list[dict]:
    """Validate every stage's config (keys, types, stage checks) and say where each input comes
    from, without loading data or weights. Inputs that do not exist yet are listed, not errors:
    a recipe is planned on a machine that has neither its corpus nor its models."""
    data = _plain(path, data)
    stages = pipeline_stages(data, path)
    return plan_stages(path, data, stages, split_overrides(overrides, stages), runs_dir)


def plan_stages(
    path: Path, data: dict, stages: list[str], per_stage: dict[str, list[str]], runs_dir: Path | None
) -> list[dict]:
    import dataclasses

    runs_dir = Path(runs_dir) if runs_dir else default_runs_dir()
    plan = []
    for i, stage in enumerate(stages):
        module = stage_module(stage)
        cfg = stage_config(stage, _section(data, stage, path), per_stage[stage], f"{path}: {stage}")
        if hasattr(module, "validate"):
            module.validate(cfg)
        defaults = dataclasses.asdict(module.Config())
        settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in module.INPUTS and v != defaults.get(k)}
        inputs = {
            f: _plan_input(getattr(cfg, f), src, stages[:i], runs_dir)
            for f, src in module.INPUTS.items()
            if getattr(cfg, f)
        }
        plan.append({"stage": stage, "settings": settings, "inputs": inputs})
    return plan


def _plan_input(value: str, src: str, earlier: list[str], runs_dir: Path) -> str:
    from r3rag.core.artifacts import resolve

    if value == f"{src}:latest" and src in earlier:
        return f"this run's {src}"
    if src == FILE:
        return value if Path(value).is_file() else f"{value} (missing: needed at run time)"
    try:
        return str(resolve(value, src, runs_dir, verify=False).path)
    except UserError:
        return f"{value} (not found: needed at run time)"


def print_plan(plan: list[dict], path: Path) -> None:
    table = Table(title=f"plan of {path} (dry run: nothing loaded or written)")
    for col in ("stage", "inputs", "settings (not default)"):
        table.add_column(col, overflow="fold")
    for row in plan:
        table.add_row(
            row["stage"],
            "\n".join(f"{k}: {v}" for k, v in row["inputs"].items()) or "-",
            ", ".join(f"{k}={v}" for k, v in row["settings"].items()) or "-",
        )
    _literal_console().print(table)


def _literal_console():
    """For tables of the user's paths and settings: rich would read `[x]` as markup, `:100:` as an emoji."""
    from rich.console import Console

    return Console(markup=False, emoji=False, highlight=False)


def split_overrides(overrides: list[str], stages: list[str]) -> dict[str, list[str]]:
    """["sft.lr=1e-4"] -> {"sft": ["lr=1e-4"], ...}; every key must name a stage of the pipeline."""
    out: dict[str, list[str]] = {s: [] for s in stages}
    for item in overrides:
        key, sep, value = item.partition("=")
        stage, dot, rest = key.strip().partition(".")
        if not sep or not dot or not rest:
            raise UserError(f"--set {item!r}: in a pipeline, name the stage: <stage>.<key>=value")
        if stage not in out:
            raise UserError(f"--set {item!r}: {stage!r} is not a stage of this pipeline ({', '.join(stages)})")
        out[stage].append(f"{rest}={value}")
    return out


def list_runs(stage: str | None, runs_dir: Path | None) -> None:
    runs_dir = Path(runs_dir) if runs_dir else default_runs_dir()
    if stage and stage not in (*STAGES, "table"):  # `table`: an experiment's results table
        raise UserError(f"unknown stage {stage!r} (known: {', '.join(STAGES)}, table)")
    table = Table(title=f"artifacts in {runs_dir}")
    for col in ("stage", "id", "finished", "seconds", "key metrics"):
        table.add_column(col)
    for ref in list_artifacts(runs_dir, stage):
        m = ref.manifest
        metrics = ", ".join(f"{k}={v}" for k, v in m.get("metrics", {}).items() if isinstance(v, (int, float)))[:80]
        when = datetime.fromtimestamp(m.get("finished_at", 0)).strftime("%Y-%m-%d %H:%M")
        table.add_row(ref.stage, ref.id, when, str(m.get("seconds", "")), metrics)
    _literal_console().print(table)
