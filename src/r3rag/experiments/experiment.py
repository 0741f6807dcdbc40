"""Experiments: one pipeline file, several variants of it, one results table.

A pipeline with `variants` and `table` sections (pipelines/replicate.yaml) runs the pipeline
once per variant, in order, each with its own `stages` list (default: the pipeline's) and `set`
overrides (`<stage>.<key>=value`), then builds the table from the variants' eval metrics.
Variants share every artifact whose config and inputs are equal, so a variant only trains what
it changes. `${variant.stage}` in a `set` value is the path of an artifact an earlier variant
built (e.g. the dense index the main variant's eval also searches with).

    variants:
      dense: {stages: [world, index], set: [index.backend=dense, index.name=dense]}
      main: {set: ["eval.retrievers=[${dense.index}]"]}
      nomask: {set: [rl.mask_retrieved=false, "eval.systems=[rl]"]}
    table:                                   # row label: <variant>/<system label in its eval>
      SFT + GRPO: main/rl@dense
      SFT + GRPO, no masking: nomask/rl

Writes runs/table/<name>-<hash>/ with table.md (printed too) and table.json: per row EM with
its 95% bootstrap interval, F1, EM by hops, searches, and the training time of the row's
policy (its base, sft and rl artifacts' wall seconds, as recorded when they were built).
`--set` overrides on the command line apply to every variant that runs that stage. With a top-level
`results: results/<name>.json`, the run also writes that results file, last (r3rag.experiments.results.file),
from which `r3rag report --results` regenerates the docs' tables (r3rag.experiments.results.docs). A `slices`
section divides the variants into units of work run one at a time with `--slice NAME` (r3rag.experiments.slices.cut).
`r3rag run FILE` reaches this module through r3rag.experiments.run, which also takes plain pipelines and slices.

Usage:
    r3rag run pipelines/replicate.yaml
    r3rag run pipelines/replicate.yaml --dry-run
    ref = run_experiment(Path("pipelines/replicate.yaml"), data, [], runs_dir=None)
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

from r3rag.core.artifacts import ArtifactRef, ArtifactWriter
from r3rag.core.build_lock import ArtifactBusy, BuildLock
from r3rag.experiments.pipeline import (
    pipeline_stages,
    plan_stages,
    run_stages,
    split_overrides,
)
from r3rag.experiments.results.compare import build_comparisons, compare_claims, compare_spec, comparison_markdown
from r3rag.util.errors import UserError

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
VARIANT_KEYS = {"stages", "set"}
BUSY_POLL_SECONDS = 5.0  # a `--jobs` worker with nothing free to build looks again this often


def parse_variants(path: Path, data: dict) -> dict[str, dict]:
    """{name: {"stages": [...], "set": [...]}}, checked: every `set` key names one of its stages."""
    raw = data.get("variants") or {}
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{path}: variants: expected a mapping of variant name -> {{stages, set}}")
    if not isinstance(data.get("table"), dict) or not data["table"]:
        raise UserError(f"{path}: table: expected a mapping of row label -> <variant>/<system>")
    default_stages = pipeline_stages({k: v for k, v in data.items() if k not in ("variants", "table")}, path)
    out = {}
    for name, spec in raw.items():
        spec = spec or {}
        where = f"{path}: variants.{name}"
        if not isinstance(spec, dict) or set(spec) - VARIANT_KEYS:
            raise UserError(f"{where}: expected a mapping with keys {sorted(VARIANT_KEYS)}")
        stages = pipeline_stages({"stages": spec.get("stages") or default_stages}, path)
        sets = spec.get("set") or []
        if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
            raise UserError(f"{where}.set: expected a list of <stage>.<key>=value strings")
        for item in sets:
            stage = item.partition(".")[0].strip()
            if stage not in stages:
                raise UserError(f"{where}.set: {item!r} names stage {stage!r}, not one of {', '.join(stages)}")
            _check_placeholders(item, out, f"{where}.set")
        out[str(name)] = {"stages": stages, "set": sets}
    for label, source in data["table"].items():
        sources = source if isinstance(source, list) else [source]  # a list: one source per seed
        for one in sources or [""]:
            variant, _, system = str(one).partition("/")
            if variant not in out or not system or "eval" not in out[variant]["stages"]:
                raise UserError(
                    f"{path}: table.{label}: {one!r} is not <variant>/<system> of a variant "
                    f"that runs eval (variants: {', '.join(out)})"
                )
    return out


def _check_placeholders(item: str, earlier: dict[str, dict], where: str) -> None:
    """Every ${variant.stage} in `item` names a stage of an earlier variant (before any training;
    a `--jobs` worker would otherwise wait forever for it)."""
    for variant, stage in _refs(item):
        if stage not in earlier.get(variant, {}).get("stages", []):
            named = ", ".join(f"{v}.{s}" for v in earlier for s in earlier[v]["stages"]) or "none"
            raise UserError(
                f"{where}: ${{{variant}.{stage}}} is not an artifact of an earlier variant (earlier: {named})"
            )


def _refs(item: str) -> list[tuple[str, str]]:
    """The (variant, stage) pairs `item` names with ${variant.stage}."""
    return [tuple(ref.partition(".")[::2]) for ref in PLACEHOLDER.findall(item)]


def placeholders(spec: dict) -> list[tuple[str, str]]:
    """The (variant, stage) pairs a variant's `set` names with ${variant.stage}."""
    return [ref for item in spec["set"] for ref in _refs(item)]


def fill(item: str, built: dict[str, dict[str, ArtifactRef]] | None, where: str) -> str:
    """${variant.stage} -> that artifact's path (built=None: a dry run, a readable stand-in)."""

    def one(m: re.Match) -> str:
        variant, _, stage = m.group(1).partition(".")
        if built is None:
            return f"<{variant}.{stage}>"
        if variant not in built or stage not in built[variant]:
            raise UserError(
                f"{where}: ${{{m.group(1)}}} is not an artifact of an earlier variant "
                f"(earlier: {', '.join(f'{v}.{s}' for v in built for s in built[v]) or 'none'})"
            )
        return str(built[variant][stage].path)

    return PLACEHOLDER.sub(one, item)


def variant_overrides(path, name: str, spec: dict, overrides: list[str], built) -> dict[str, list[str]]:
    """Per stage: the variant's own `set` (placeholders filled), then the command line's."""
    own = [fill(item, built, f"{path}: variants.{name}.set") for item in spec["set"]]
    per_stage = split_overrides(own, spec["stages"])
    for item in overrides:
        stage = item.partition(".")[0].strip()
        if stage in per_stage:
            per_stage[stage] += split_overrides([item], [stage])[stage]
    return per_stage


def check_overrides(overrides: list[str], variants: dict[str, dict]) -> None:
    all_stages = list(dict.fromkeys(s for v in variants.values() for s in v["stages"]))
    split_overrides(overrides, all_stages)  # every key names a stage some variant runs


def run_experiment(path: Path, data: dict, overrides: list[str], runs_dir: Path | None) -> ArtifactRef:
    from rich.console import Console

    from r3rag.experiments.results.file import results_spec, write_results

    results = results_spec(path, data)  # before hours of training, not after
    built, table = build_experiment(path, data, overrides, runs_dir)
    if results:  # last: the docs are generated from it, and it names the table artifact
        Console().print(f"[green]results[/green]: wrote {write_results(results, path, data, built, table)}")
    return table


def build_experiment(path: Path, data: dict, overrides: list[str], runs_dir: Path | None) -> tuple[dict, ArtifactRef]:
    """Every variant built or reused, then the table: ({variant: {stage: ref}}, the table artifact)."""
    from rich.console import Console

    variants = parse_variants(path, data)
    compare_spec(path, data)  # before hours of training, not after
    check_overrides(overrides, variants)
    console, t0 = Console(), time.time()
    built = build_variants(path, data, variants, overrides, runs_dir, console)
    return built, write_table(path, data, built, time.time() - t0, runs_dir, console)


def build_variants(
    path: Path, data: dict, variants: dict, overrides: list[str], runs_dir, console, busy: str = "wait"
) -> dict[str, dict[str, ArtifactRef]]:
    """Every variant's artifacts {variant: {stage: ref}}, built or reused, in file order.
    busy="skip" (a `run --jobs` worker, r3rag.experiments.jobs): a variant whose next stage another
    process is building, or whose ${variant.stage} is not built yet, is set aside and retried
    (the earliest first) until all are done; the others' artifacts are reused, not rebuilt."""
    built: dict[str, dict[str, ArtifactRef]] = {}
    pending, announced = list(variants), set()
    blocked: dict[str, Path] = {}  # variant -> the artifact another process held when last tried
    while pending:
        for name in pending:
            spec = variants[name]
            if busy == "skip" and any(s not in built.get(v, {}) for v, s in placeholders(spec)):
                continue
            if name in blocked and BuildLock(blocked[name]).held_elsewhere():
                continue  # still busy: checked by its lock, not by hashing the stage's inputs again
            if name not in announced:  # once: a worker may try a variant many times
                console.rule(f"variant {name}")
                announced.add(name)
            per_stage = variant_overrides(path, name, spec, overrides, built)
            try:
                run_stages(path, data, spec["stages"], per_stage, runs_dir, built.setdefault(name, {}), busy)
            except ArtifactBusy as busy_one:
                blocked[name] = busy_one.final
                continue
            pending.remove(name)
            break  # from the earliest again: the file's order stays the preferred one
        else:  # every variant left waits on another process
            time.sleep(BUSY_POLL_SECONDS)
    return built


def plan_experiment(path: Path, data: dict, overrides: list[str], runs_dir: Path | None) -> list[dict]:
    from r3rag.experiments.results.file import results_spec

    variants = parse_variants(path, data)
    results_spec(path, data)  # checked in a dry run too
    compare_spec(path, data)
    check_overrides(overrides, variants)
    plan = []
    for name, spec in variants.items():
        per_stage = variant_overrides(path, name, spec, overrides, None)
        rows = plan_stages(path, data, spec["stages"], per_stage, runs_dir)
        plan += [{**row, "stage": f"{name}: {row['stage']}"} for row in rows]
    return plan


def write_table(path: Path, data: dict, built: dict, wall: float, runs_dir, console) -> ArtifactRef:
    import json

    from r3rag.experiments.results.table import build_rows, markdown, plot

    evals = {name: refs["eval"] for name, refs in built.items() if "eval" in refs}
    rows = build_rows(data["table"], built, path)
    config = {"variants": data.get("variants"), "table": data["table"]}
    if data.get("compare"):  # only then: the ids of tables without comparisons stay what they were
        config["compare"] = data["compare"]
    writer = ArtifactWriter("table", str(data.get("name", "experiment")), config, evals, runs_dir)
    if writer.existing:  # same variants, same artifacts: the table (and its timings) as first written
        print((writer.existing.path / "table.md").read_text())
        return writer.existing
    artifacts = {str(r.path): r.manifest.get("seconds", 0.0) for refs in built.values() for r in refs.values()}
    about = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "wall_seconds": round(wall, 1),
        "compute_seconds": round(sum(artifacts.values()), 1),
    }
    comparisons = build_comparisons(compare_spec(path, data), data["table"], built, claims=compare_claims(path, data))
    text = markdown(rows, about) + ("\n" + comparison_markdown(comparisons) if comparisons else "")
    with writer:
        (writer.dir / "table.md").write_text(text)
        (writer.dir / "table.json").write_text(
            json.dumps({"rows": rows, "comparisons": comparisons, **about}, indent=2)
        )
        plot(rows, writer.dir / "table.png")
        writer.metrics.update({r["label"]: r["em"] for r in rows})
        writer.extra["about"] = about
    print(text)
    console.print(f"[green]table[/green]: wrote {writer.final}")
    return writer.ref


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {os.cpu_count()} cores, {device}, torch {torch.__version__}"
