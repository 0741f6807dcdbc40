"""Seeds in an experiment: every variant whose stages take a seed runs once per seed.

An experiment (r3rag.experiments.experiment) with a top-level `seeds` section

    seeds:
      values: [0, 1, 2]
      set: ["sft.seed={seed}", "rl.seed={seed}"]   # added to each variant that runs the stage

runs each variant that runs one of the named stages once per seed, as `<variant>#s<seed>`, with
the `set` items of its stages filled in. A variant that runs none of them (a world and its
index) runs once and is shared. Inside a seeded variant, `${other.stage}` names the same seed's
artifact of a seeded `other` (seed 1's GRPO starts from seed 1's cold start). A table row whose
source names a seeded variant becomes a seed row: one source per seed, reported as mean ± sd.
Variants run seed by seed (all of seed 0 first), so an interrupted run has whole seeds done.

Usage:
    data = expand_seeds(path, data)      # before r3rag.experiments.experiment.parse_variants
"""

from __future__ import annotations

import re
from pathlib import Path

from r3rag.util.errors import UserError

PLACEHOLDER = re.compile(r"\$\{([^}.]*)\.([^}]*)\}")
SEED_KEYS = {"values", "set"}


def seeded_name(variant: str, seed: int) -> str:
    return f"{variant}#s{seed}"


def expand_seeds(path: Path, data: dict) -> dict:
    """`data` with `seeds` applied (variants and table rewritten); unchanged without `seeds`."""
    if not data.get("seeds"):  # none, or `seeds: null` in a file that extends a seeded one
        return {k: v for k, v in data.items() if k != "seeds"}
    values, seed_set = _parse(path, data["seeds"])
    variants = data.get("variants") or {}
    seeded = {name for name, spec in variants.items() if _seed_items(spec, seed_set, data)}
    out: dict[str, dict] = {}
    for i, seed in enumerate(values):
        for name, spec in variants.items():
            spec = dict(spec or {})
            if name not in seeded:
                if i == 0:
                    out[name] = _check_refs(path, name, spec, seeded)
                continue
            items = [item.replace("{seed}", str(seed)) for item in _seed_items(spec, seed_set, data)]
            sets = [_same_seed(item, seeded, seed) for item in spec.get("set") or []]
            out[seeded_name(name, seed)] = {**spec, "set": sets + items}
    table = {label: _seed_sources(source, seeded, values) for label, source in (data.get("table") or {}).items()}
    return {**{k: v for k, v in data.items() if k != "seeds"}, "variants": out, "table": table}


def _parse(path: Path, seeds) -> tuple[list[int], list[str]]:
    if not isinstance(seeds, dict) or set(seeds) - SEED_KEYS or "values" not in seeds:
        raise UserError(f"{path}: seeds: expected a mapping with `values` (a list of ints) and `set`")
    values, seed_set = seeds["values"], seeds.get("set") or []
    if not isinstance(values, list) or not values or not all(isinstance(v, int) for v in values):
        raise UserError(f"{path}: seeds.values: expected a non-empty list of ints, got {values!r}")
    if len(set(values)) != len(values):
        raise UserError(f"{path}: seeds.values: {values!r} repeats a seed")
    if not isinstance(seed_set, list) or not all(isinstance(s, str) and "{seed}" in s for s in seed_set):
        raise UserError(f"{path}: seeds.set: expected a list of <stage>.<key>={{seed}} strings")
    return values, seed_set


def _seed_items(spec, seed_set: list[str], data: dict) -> list[str]:
    """The seed's `set` items for the stages this variant runs."""
    stages = (spec or {}).get("stages") or data.get("stages") or []
    return [item for item in seed_set if item.partition(".")[0].strip() in stages]


def _same_seed(item: str, seeded: set[str], seed: int) -> str:
    def one(m: re.Match) -> str:
        variant = seeded_name(m.group(1), seed) if m.group(1) in seeded else m.group(1)
        return f"${{{variant}.{m.group(2)}}}"

    return PLACEHOLDER.sub(one, item)


def _check_refs(path: Path, name: str, spec: dict, seeded: set[str]) -> dict:
    for item in spec.get("set") or []:
        for m in PLACEHOLDER.finditer(item):
            if m.group(1) in seeded:
                raise UserError(
                    f"{path}: variants.{name}.set: {item!r} names seeded variant {m.group(1)!r} from "
                    f"{name!r}, which runs no seeded stage: which seed's artifact is meant?"
                )
    return spec


def _seed_sources(source, seeded: set[str], values: list[int]):
    sources = source if isinstance(source, list) else [source]
    out = []
    for one in sources:
        variant, slash, system = str(one).partition("/")
        out += [seeded_name(variant, s) + slash + system for s in values] if variant in seeded else [one]
    return out if len(out) > 1 or isinstance(source, list) else out[0]
