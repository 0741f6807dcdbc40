"""Merging an experiment's slice files (r3rag.experiments.slices.file) into its results file and the docs' tables.

`r3rag report --results results/replicate.json` first merges results/replicate/*.json, when that
folder holds slice files, into results/replicate.json, then regenerates the docs' blocks from it
(r3rag.experiments.results.docs). The merge needs every slice of the pipeline the files name, each with a
current file (its settings fingerprint the pipeline's, r3rag.experiments.slices.cut); `r3rag run FILE --status`
says which are missing or stale. Rows and paired comparisons are computed by the experiment's own
code (r3rag.experiments.results.table.rows_from, r3rag.experiments.results.compare.build_comparisons) from each slice's
per-question EM, so the merged file equals what one run of every slice on one machine would write,
for the same per-question outcomes; a run's dev EM may come from another slice's dev eval of the
same policy (matched by its policy key, as r3rag.experiments.results.file does within one run).

Two files of one slice (a rerun, here or on another machine; both current): **the first to finish
counts** (`finished`, then the file name): a rerun cannot replace a figure already committed, so
no slice is rerun until it looks better. The others are listed under `reruns`, with the artifacts
whose ids differ and, per system, the EM of each file and how many questions' EM differ. To replace
a slice's figures on purpose (a bug found), `git rm` its file and rerun it. An artifact of one
recipe that two slices both hold (the cold start each started from, GRPO that a dev eval read) is
listed under `artifact_differences` where their ids differ (rebuilt elsewhere, not bit-identical).

Usage:
    merged = merge(Path("pipelines/replicate.yaml"), load_pipeline(path))   # the results file's content
    merge_into(Path("results/replicate.json"))                              # report --results' step
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from r3rag.experiments.results.table import Outcome, row_sources
from r3rag.experiments.slices.file import load_slice, machine_line
from r3rag.util.errors import UserError


def collect(path: Path, data: dict) -> dict:
    """The pipeline's slices and their files: {"experiment", "slices", "folder", "current": {slice:
    (file, record)}, "stale": {slice: [(file, record, why)]}, "reruns": [...]}."""
    from r3rag.experiments.slices.cut import fingerprint, load_slices, slice_experiment, slice_folder

    experiment, slices = load_slices(path, data)
    if not slices:
        raise UserError(f"{path}: declares no slices (a top-level `slices` section)")
    folder = slice_folder(path, experiment)
    subs = {name: slice_experiment(path, experiment, sl) for name, sl in slices.items()}
    prints = {name: fingerprint(path, sub, []) for name, sub in subs.items()}
    files = defaultdict(list)
    for file in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = load_slice(file)
        _check(file, record, path, slices)
        files[record["slice"]].append((file, record))
    current, stale, reruns = {}, {}, []
    for name in slices:
        good = []
        for file, record in files[name]:
            why = _stale(record, prints[name], subs[name])
            if why:
                stale.setdefault(name, []).append((file, record, why))
            else:
                good.append((file, record))
        good.sort(key=lambda fr: (fr[1]["finished"], fr[0].name))  # the rule: the first to finish counts
        if good:
            current[name] = good[0]
            reruns += [_rerun(name, good[0], other) for other in good[1:]]
    return {
        "experiment": experiment,
        "slices": slices,
        "folder": folder,
        "current": current,
        "stale": stale,
        "reruns": reruns,
    }


def _check(file: Path, record: dict, path: Path, slices: dict) -> None:
    """A file names a slice of this pipeline, and no arm (variant) that slice does not run."""
    name = record["slice"]
    if name not in slices:
        raise UserError(f"{file}: slice {name!r} is not one of {path}'s slices ({', '.join(slices)})")
    own = slices[name]["variants"]
    named = [*(record.get("variants") or []), *record["evals"], *(s.partition("/")[0] for s in record["runs"])]
    for variant in named:
        if variant not in own:
            raise UserError(
                f"{file}: names arm {variant!r}, which slice {name} does not run (it runs: {', '.join(own)})"
            )
    for source in record["runs"]:
        variant, _, system = source.partition("/")
        if system not in (record["evals"].get(variant) or {}).get("systems", {}):
            raise UserError(f"{file}: runs.{source}: its eval's per-question outcomes are missing from evals")


def _stale(record: dict, current: dict, sub: dict) -> str:
    """Why a file no longer describes what the pipeline's slice builds ("" when it does)."""
    if record["settings_hash"] != current["hash"]:
        old = record.get("settings_hashes") or {}
        changed = [k for k, h in current["stages"].items() if old.get(k) != h]
        return f"settings changed since: {', '.join(changed[:3]) or 'the stages it runs'}"
    needed = [s for src in sub["table"].values() for s in row_sources(src)]
    lacking = [s for s in needed if s not in record["runs"]]
    return f"the table now needs {lacking[0]}, which it lacks" if lacking else ""


def _rerun(name: str, kept: tuple, other: tuple) -> dict:
    """Where a second current file of one slice differs from the one kept."""
    (kept_file, a), (other_file, b) = kept, other
    outcomes = {}
    for variant, ev in a["evals"].items():
        for system, x in ev["systems"].items():
            y = (b["evals"].get(variant) or {}).get("systems", {}).get(system)
            if y is None:
                outcomes[f"{variant}/{system}"] = "not in the other file"
                continue
            ex, ey = dict(zip(x["ids"], x["em"])), dict(zip(y["ids"], y["em"]))
            differ = sum(ex.get(q) != ey.get(q) for q in {*ex, *ey})
            if differ:
                outcomes[f"{variant}/{system}"] = {"em": [x["metrics"]["em"], y["metrics"]["em"]], "questions": differ}
    ids = [(v, st, i) for v, stages in a["artifacts"].items() for st, i in stages.items()]
    return {
        "slice": name,
        "kept": str(kept_file),
        "other": str(other_file),
        "machines": [machine_line(a["machine"]), machine_line(b["machine"])],
        "artifacts_differ": [f"{v}.{st}" for v, st, i in ids if (b["artifacts"].get(v) or {}).get(st) != i],
        "outcomes_differ": outcomes,
    }


def _curves(rows: list[dict], owner: dict) -> dict:
    """{"curves": {row label: {seed: curve}}, "stability": ...} for the RL rows whose slices carry
    their training curves (r3rag.training.curves); nothing when none does (older slice files)."""
    from r3rag.training.curves import stability

    curves: dict[str, dict[str, list]] = {}
    for row in rows:
        for source in row_sources(row["source"]):
            variant, _, system = source.partition("/")
            curve = (owner[variant].get("curves") or {}).get(variant) if system == "rl" else None
            if curve:
                curves.setdefault(row["label"], {})[str(owner[variant]["seed"])] = curve
    return {"curves": curves, "stability": stability(curves)} if curves else {}


def merge(path: Path, data: dict, partial: bool = False) -> dict:
    """The results file's content from the current slice files (every slice needed, unless
    `partial`: then the rows and comparisons over the slices there are, for `--status`)."""
    from r3rag.experiments.results.compare import build_comparisons, compare_claims, compare_spec
    from r3rag.experiments.results.file import SCHEMA, relative_paths, results_spec
    from r3rag.experiments.results.table import rows_from

    found = collect(path, data)
    experiment, current = found["experiment"], found["current"]
    missing = [name for name in found["slices"] if name not in current]
    if missing and not partial:
        raise UserError(
            f"{found['folder']}: {len(missing)} of {len(found['slices'])} slices have no current file "
            f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): `r3rag run {path} --status` lists them"
        )
    owner = {v: current[name][1] for name in current for v in found["slices"][name]["variants"]}
    table = _available(experiment["table"], owner)
    evals = [(v, ev) for _, record in current.values() for v, ev in record["evals"].items()]

    def outcome(label: str, source: str) -> Outcome:
        variant, _, system = source.partition("/")
        record = owner[variant]
        s = record["evals"][variant]["systems"][system]
        return Outcome(s["metrics"], record["runs"][source]["train_seconds"], lambda: dict(zip(s["ids"], s["em"])))

    def em_of(source: str) -> dict:
        return outcome("", source).question_em()

    rows = rows_from(table, outcome)
    for row in rows:
        row["runs"] = [_with_dev(owner[s.partition("/")[0]], s, evals) for s in row_sources(row["source"])]
    pairs = [(a, b) for a, b in compare_spec(path, experiment) if a in table and b in table]
    records = [record for _, record in current.values()]
    seconds = {i: t for r in records for i, t in r["artifact_seconds"].items()}  # each artifact once
    return {
        "schema": SCHEMA,
        "experiment": str(experiment.get("name", "experiment")),
        "pipeline": relative_paths(str(path)),
        "date": max((r["finished"] for r in records), default="")[:10],
        "machine": "; ".join(dict.fromkeys(machine_line(r["machine"]) for r in records)),
        "wall_seconds": round(sum(r["wall_seconds"] for r in records), 1),
        "compute_seconds": round(sum(seconds.values()), 1),
        "table_artifact": None,  # merged from slices: each slice's table artifact is in its file
        "tables": results_spec(path, experiment)["tables"],
        "rows": rows,
        "comparisons": build_comparisons(pairs, table, None, em_of, compare_claims(path, experiment)),
        **_curves(rows, owner),
        "slices": {name: _about(file, record) for name, (file, record) in current.items()},
        "reruns": found["reruns"],
        "artifact_differences": _shared(current),
        **({"missing_slices": missing} if partial else {}),
    }


def _available(table: dict, owner: dict) -> dict:
    """The table's rows over the sources whose slice has a file (all of them once every slice has)."""
    out = {}
    for label, source in table.items():
        there = [s for s in row_sources(source) if s.partition("/")[0] in owner]
        if there:
            out[label] = there if isinstance(source, list) else there[0]
    return out


def _with_dev(record: dict, source: str, evals: list[tuple[str, dict]]) -> dict:
    """The run's entry; its dev EM from another slice's dev eval of the same policy where its own
    slice had none (r3rag.experiments.results.file._dev_em's match, over every slice)."""
    run = dict(record["runs"][source])
    if run.get("dev_from") not in (None, "rl dev evaluation"):
        return run
    variant, _, system = source.partition("/")
    key = record["evals"][variant]["systems"][system]["key"]
    for other, ev in evals:
        if ev.get("split") != "dev":
            continue
        for label, s in ev["systems"].items():
            if s["key"] == key:
                return {**run, "dev_em": s["metrics"]["em"], "dev_n": s["metrics"]["n"], "dev_from": f"{other}/{label}"}
    return run


def _about(file: Path, record: dict) -> dict:
    return {
        "file": str(file),
        "finished": record["finished"],
        "machine": machine_line(record["machine"]),
        "build_minutes": round(record.get("build_seconds", 0.0) / 60, 1),
        "code_version": record.get("code_version"),
        "settings_hash": record["settings_hash"],
    }


def _shared(current: dict) -> list[dict]:
    """Artifacts of one recipe that slices hold under different ids (a cold start or GRPO that two
    slices built, each on its own machine, not bit-identical): the same recipe is the same
    settings fingerprint of the stage and of every stage before it in the variant (so main's GRPO
    and dev's, built once in one run, are one artifact)."""
    seen: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for name, (_, record) in current.items():
        hashes = record.get("settings_hashes") or {}
        for variant, stages in record["artifacts"].items():
            chain = ""
            for stage, artifact in stages.items():
                chain += "/" + hashes.get(f"{variant}.{stage}", f"{variant}.{stage}")
                seen[chain].setdefault(name, (f"{variant}.{stage}", artifact))
    out = []
    for held in seen.values():
        if len({artifact for _, artifact in held.values()}) > 1:
            ids = {f"{name}:{label}": artifact for name, (label, artifact) in held.items()}
            out.append({"artifact": next(iter(held.values()))[0], "ids": ids})
    return out


def merge_into(results_path: Path) -> tuple[Path, int] | None:
    """Merge the slice files beside `results_path` (its folder of the same name) into it; (the
    pipeline, the number of slices), or None where there is no slice file."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.results.file import results_spec, write_text_atomic

    folder = Path(results_path).with_suffix("")
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return None
    pipelines = sorted({load_slice(f)["pipeline"] for f in files})
    if len(pipelines) > 1:
        raise UserError(
            f"{folder}: slice files of several pipelines ({', '.join(pipelines)}): one folder, one pipeline"
        )
    path = Path(pipelines[0])
    if not path.is_file():
        raise UserError(f"{folder}: its slice files name pipeline {path}, which does not exist here")
    data = load_pipeline(path)
    merged = merge(path, data)
    writes = results_spec(path, data)["path"]
    if writes.resolve() != Path(results_path).resolve():
        raise UserError(f"{folder}: its slices' pipeline {path} writes {writes}, not {results_path}")
    write_text_atomic(Path(results_path), json.dumps(merged, indent=2, default=str) + "\n")
    return path, len(merged["slices"])
