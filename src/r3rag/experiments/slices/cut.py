"""An experiment's slices: units of work small enough that a lost machine costs at most one.

A long experiment (pipelines/replicate.yaml: a day of build on 2 cores) names its slices in a
top-level `slices` section: each a name, the variants it runs, and an estimate of its build
minutes from nothing (used by `--status` until a slice of the same kind has been committed).
A name with `{seed}` is one slice per seed of `seeds` (the variants at that seed):

    slices:                                  # each at most ~100 min of build on 2 AVX2 cores
      w1-grpo-s{seed}: {variants: [main, dev], minutes: 80}      # w1-grpo-s0, w1-grpo-s1, ...
      w1-readers-s{seed}: {variants: [reader_rag12, reader_gold], minutes: 75}

Every table source (`<variant>/<system>`, at every seed) lies in exactly one slice, so the
slices' files together hold the whole table. `r3rag run FILE --slice w1-grpo-s0` builds the
slice's variants and the artifacts they start from (`${main.sft}` in a variant of another slice:
main's stages up to sft, reused where this machine has them, rebuilt where it lost them), then
writes the slice's results file (r3rag.experiments.slices.file); r3rag.experiments.slices.merge
merges the files.

A slice is named by variants and seeds, not by artifact ids: a recipe change (another cold start)
changes its ids and its settings fingerprint, never its name. The fingerprint hashes the hashed
settings (r3rag.util.config.hashed_settings: threads and the like left out) of every stage the slice
runs, with the artifacts a stage reads named `<variant.stage>`, not by id; a committed slice file
whose fingerprint differs from the pipeline's is stale, to be rerun.

Usage:
    experiment, slices = load_slices(path, load_pipeline(path))   # experiment: seeds expanded
    sub = slice_experiment(path, experiment, slices["w1-grpo-s0"])      # that slice's variants alone
    fingerprint(path, sub, overrides=[])                          # {"hash", "stages", "settings"}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

from r3rag.experiments.experiment import parse_variants, placeholders, variant_overrides
from r3rag.experiments.results.compare import entry_rows
from r3rag.experiments.results.table import row_sources
from r3rag.experiments.seeds import expand_seeds, seeded_name
from r3rag.util.errors import UserError

SLICE_KEYS = {"variants", "minutes"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a file name: no dots (a rerun's file adds one)
MAX_MINUTES = 100  # a slice's budget of build on 2 AVX2 cores: a lost machine costs at most this


def load_slices(path: Path, data: dict) -> tuple[dict, dict[str, dict]]:
    """(the experiment with its seeds expanded, {slice name: slice}) for load_pipeline's `data`;
    no slices: {}. A slice: {"name", "kind" (its name as written), "seed", "variants" (its own,
    seeds expanded), "minutes"}. Checked: every table source in exactly one slice."""
    experiment = expand_seeds(path, data)
    raw = data.get("slices")
    if not raw:
        return experiment, {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: slices: expected a mapping of slice name -> {{variants, minutes}}")
    seeds = (data.get("seeds") or {}).get("values") or []
    declared = list((data.get("variants") or {}).keys())
    slices: dict[str, dict] = {}
    for kind, spec in raw.items():
        where = f"{path}: slices.{kind}"
        if not isinstance(spec, dict) or set(spec) - SLICE_KEYS or not isinstance(spec.get("variants"), list):
            raise UserError(f"{where}: expected a mapping with `variants` (a list) and optionally `minutes`")
        unknown = [v for v in spec["variants"] if v not in declared]
        if unknown or not spec["variants"]:
            raise UserError(f"{where}: {unknown[0] if unknown else 'no variant'!r} is not a variant of {path.name}")
        minutes = spec.get("minutes")
        if minutes is not None and (not isinstance(minutes, (int, float)) or minutes <= 0):
            raise UserError(f"{where}.minutes: expected a positive number of minutes, got {minutes!r}")
        if "{seed}" in str(kind) and not seeds:
            raise UserError(f"{where}: `{{seed}}` in a slice name needs a `seeds` section")
        for seed in seeds if "{seed}" in str(kind) else [None]:
            name = str(kind).replace("{seed}", str(seed))
            if not NAME.fullmatch(name) or name in slices:
                raise UserError(f"{where}: {name!r} is not a unique name of letters, digits, '-' and '_'")
            own = [_expanded(v, seed, seeds, experiment["variants"]) for v in spec["variants"]]
            slices[name] = {"name": name, "kind": str(kind), "seed": seed, "variants": sum(own, []), "minutes": minutes}
    _check_cover(path, experiment, slices)
    slice_folder(path, experiment)  # their files go beside the results file: there must be one
    return experiment, slices


def _expanded(variant: str, seed: int | None, seeds: list[int], variants: dict) -> list[str]:
    """A slice's variant as the experiment names it: at the slice's seed, or at every seed."""
    if seeds and seeded_name(variant, seeds[0]) in variants:
        return [seeded_name(variant, s) for s in ([seed] if seed is not None else seeds)]
    return [variant]


def _check_cover(path: Path, experiment: dict, slices: dict[str, dict]) -> None:
    """Each table source's variant in exactly one slice; each slice holds a table source."""
    owner: dict[str, str] = {}
    table_variants = {s.partition("/")[0] for src in experiment["table"].values() for s in row_sources(src)}
    for name, sl in slices.items():
        for variant in sl["variants"]:
            if variant in table_variants and owner.setdefault(variant, name) != name:
                raise UserError(f"{path}: slices: {variant} is in both {owner[variant]} and {name}")
        if not table_variants & set(sl["variants"]):
            raise UserError(f"{path}: slices: {name} runs no variant of the table (it would record nothing)")
    missing = sorted(table_variants - set(owner))
    if missing:
        raise UserError(f"{path}: slices: the table's {missing[0]} is in no slice (every table variant needs one)")


def pick(path: Path, slices: dict[str, dict], name: str) -> dict:
    if not slices:
        raise UserError(f"{path}: --slice: this pipeline declares no slices (a top-level `slices` section)")
    if name not in slices:
        raise UserError(f"{path}: --slice {name!r}: no such slice (slices: {', '.join(slices)})")
    return slices[name]


def slice_experiment(path: Path, experiment: dict, sl: dict) -> dict:
    """The experiment of one slice: its own variants, and before them in the file's order the
    stages of other variants they start from (up to the stage named); its table's rows over its
    own sources (one seed of a row over seeds), the comparisons between them; no results file."""
    variants = parse_variants(path, experiment)
    need = {v: variants[v]["stages"] for v in sl["variants"]}
    todo = list(sl["variants"])
    while todo:  # the variants they start from, to the last stage they name, and what those start from
        v = todo.pop()
        for other, stage in placeholders({"set": _kept_set(variants[v]["set"], need[v])}):
            stages = variants[other]["stages"]
            upto = stages[: stages.index(stage) + 1]
            if len(upto) > len(need.get(other, [])):
                need[other] = upto
                todo.append(other)
    subset = {
        v: {"stages": need[v], "set": _kept_set(spec["set"], need[v])} for v, spec in variants.items() if v in need
    }
    own = set(sl["variants"])
    table = {}
    for label, source in experiment["table"].items():
        mine = [s for s in row_sources(source) if s.partition("/")[0] in own]
        if mine:
            table[label] = mine if len(mine) > 1 else mine[0]
    compare = [e for e in experiment.get("compare") or [] if (rows := entry_rows(e)) and all(r in table for r in rows)]
    drop = ("slices", "results", "compare")
    return {
        **{k: v for k, v in experiment.items() if k not in drop},
        "variants": subset,
        "table": table,
        "compare": compare,
    }


def _kept_set(items: list[str], stages: list[str]) -> list[str]:
    """A variant's `set` items for the stages it runs here (a variant cut to its cold start keeps no eval item)."""
    return [item for item in items if item.partition(".")[0].strip() in stages]


def fingerprint(path: Path, sub: dict, overrides: list[str]) -> dict:
    """The slice's settings: {"hash": of every stage's, "stages": {"<variant>.<stage>": hash},
    "settings": {variant: {stage: its settings that differ from the stage's defaults}}}."""
    from r3rag.experiments.pipeline import _section, stage_config
    from r3rag.stages import stage_module
    from r3rag.util.config import hashed_settings

    stages, settings = {}, {}
    for name, spec in parse_variants(path, sub).items():
        per_stage = variant_overrides(path, name, spec, overrides, None)  # ${v.stage} -> "<v.stage>"
        for stage in spec["stages"]:
            module = stage_module(stage)
            cfg = stage_config(stage, _section(sub, stage, path), per_stage[stage], f"{path}: {name}: {stage}")
            skip = set(module.INPUTS)  # artifacts read: by id at run time, named by stage here
            hashed = {k: v for k, v in hashed_settings(cfg).items() if k not in skip}
            defaults = hashed_settings(module.Config())
            stages[f"{name}.{stage}"] = _hash(hashed)
            changed = {k: v for k, v in hashed.items() if defaults.get(k) != v and k != "name"}
            if changed:
                settings.setdefault(name, {})[stage] = json.loads(json.dumps(changed, default=str))
    return {"hash": _hash(stages), "stages": stages, "settings": settings}


def check_overrides(path: Path, sub: dict, sl: dict, overrides: list[str]) -> dict:
    """The slice's fingerprint, refusing `--set` items that change what it builds (its file would
    then not merge with the others'); threads and the like may change."""
    settings = fingerprint(path, sub, overrides)
    if overrides and settings["hash"] != fingerprint(path, sub, [])["hash"]:
        raise UserError(
            f"--slice {sl['name']}: --set {' '.join(overrides)} changes what the slice builds, so its file "
            "would not merge with the others': change the pipeline file instead (--set may change threads and the like)"
        )
    return settings


def _hash(value) -> str:
    text = json.dumps(value, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return str(value)


def slice_folder(path: Path, data: dict) -> Path:
    """Where the slices' files go: beside the experiment's results file, in a folder of its name
    (results/replicate.json: results/replicate/)."""
    from r3rag.experiments.results.file import results_spec

    spec = results_spec(path, data)
    if spec is None:
        raise UserError(f"{path}: slices: a pipeline with slices needs `results:` (its slices' files go beside it)")
    return spec["path"].with_suffix("")
