"""One slice run and its results file: what survives when the machine and its runs directory do not.

`r3rag run FILE --slice NAME` (r3rag.experiments.slices.cut) builds the slice's variants and writes, last and
atomically, `<results folder>/<NAME>.json` (results/replicate.json's slices: results/replicate/):

- `slice`, `kind`, `seed`, `variants` (its own), `experiment`, `pipeline`;
- `settings_hash`, `settings_hashes` (per `<variant>.<stage>`) and `settings` (the non-default
  ones): the recipe, by which a file that no longer matches the pipeline is known (stale);
- `evals`: per variant with an eval, its artifact id, split and, per system it evaluated, the
  eval's metrics, the policy key (system, sft and rl artifact ids, retriever: what a dev eval is
  matched by) and the per-question `ids`, `em` and `f1` (in predictions.jsonl's order, averaged
  over samples): what the merge's rows and paired comparisons are computed from;
- `runs`: per table source (`<variant>/<system>`) the entry results/replicate.json holds for it
  (r3rag.experiments.results.file: test and dev EM, steps, seconds, settings, artifact ids);
- `curves`: per variant that trained with RL, its training reward per step and dev EM where it
  was evaluated (the artifact's metrics.jsonl), for charts and stability measures;
- `artifacts` ({variant: {stage: id}}, the ones it started from included), `artifact_seconds`
  (each one's build time, as first built), `build_seconds` (their sum: the slice from nothing),
  `built_here_seconds`, `wall_seconds`, `started`, `finished` (UTC), `machine` (CPU model, cores,
  vector extensions, GPU, torch, Python) and `code_version`.

The name is free: where `<NAME>.json` already records other artifacts with the same settings (a
rerun, on this machine or another), the new file is `<NAME>.rerun2.json` (then 3, ...), and the
merge keeps the first to finish (r3rag.experiments.slices.merge); a file with the same artifacts is left as it
is, a stale `<NAME>.json` is replaced (git keeps the old one). The run prints the `git add` and
`git commit` of the file; with `--commit` it commits that one file itself.

Usage:
    r3rag run pipelines/replicate.yaml --slice w1-grpo-s0 [--commit]
    record = load_slice(Path("results/replicate/w1-grpo-s0.json"))   # one clear line if it is not one
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path

from r3rag.util.errors import UserError

KIND = "r3rag slice"
SCHEMA = 1
REQUIRED = {
    "slice": str,
    "experiment": str,
    "pipeline": str,
    "settings_hash": str,
    "finished": str,
    "wall_seconds": (int, float),
    "build_seconds": (int, float),
}
REQUIRED_MAPS = ("evals", "runs", "artifacts", "artifact_seconds", "machine")


def run_slice(path: Path, experiment: dict, sl: dict, overrides: list[str], runs_dir, commit: bool):
    """Build one slice, write its file, print (or run) the commit; returns the slice's table artifact."""
    from r3rag.experiments.experiment import build_experiment
    from r3rag.experiments.slices.cut import check_overrides, slice_experiment, slice_folder

    folder = slice_folder(path, experiment)
    sub = slice_experiment(path, experiment, sl)
    settings = check_overrides(path, sub, sl, overrides)
    started = time.time()
    built, table = build_experiment(path, sub, overrides, runs_dir)
    record = slice_record(path, experiment, sl, sub, settings, built, started)
    target = target_file(folder, sl["name"], record)
    if target is None:
        print(f"slice {sl['name']}: its file already records these artifacts; nothing written")
        return table
    write_slice(target, record)
    minutes = record["build_seconds"] / 60
    print(
        f"slice {sl['name']}: wrote {target} (build {minutes:.1f} min from nothing, this run {record['wall_seconds'] / 60:.1f} min)"
    )
    if commit:
        print(f"slice {sl['name']}: committed {git_commit(target, sl['name'], record)}")
    else:
        print(f"commit it now (a lost machine keeps nothing else): {commit_line(target, sl['name'], record)}")
    return table


def slice_record(
    path: Path, experiment: dict, sl: dict, sub: dict, settings: dict, built: dict, started: float
) -> dict:
    from r3rag.core.artifacts import built_seconds, code_version
    from r3rag.experiments.results.file import relative_paths, run_entry
    from r3rag.experiments.results.table import row_sources

    sets = {name: list(spec.get("set") or []) for name, spec in sub["variants"].items()}
    sources = [s for src in sub["table"].values() for s in row_sources(src)]
    refs = {ref.id: ref for v in built.values() for ref in v.values()}
    seconds = {i: round(built_seconds(r.manifest) or 0.0, 1) for i, r in refs.items()}
    here = [i for i, r in refs.items() if r.manifest.get("finished_at", 0) >= started]  # built by this run
    now = time.time()
    return {
        "kind": KIND,
        "schema": SCHEMA,
        "experiment": str(experiment.get("name", "experiment")),
        "pipeline": relative_paths(str(path)),
        "slice": sl["name"],
        "slice_kind": sl["kind"],
        "seed": sl["seed"],
        "variants": sl["variants"],
        "settings_hash": settings["hash"],
        "settings_hashes": settings["stages"],
        "settings": settings["settings"],
        "started": _utc(started),
        "finished": _utc(now),
        "wall_seconds": round(now - started, 1),
        "build_seconds": round(sum(seconds.values()), 1),
        "built_here_seconds": round(sum(seconds[i] for i in here), 1),
        "machine": machine_info(),
        "code_version": code_version(),
        "artifacts": {v: {stage: ref.id for stage, ref in stages.items()} for v, stages in built.items()},
        "artifact_seconds": seconds,
        "evals": {v: _eval(refs["eval"]) for v, refs in built.items() if "eval" in refs and v in sl["variants"]},
        "runs": {s: run_entry(*s.split("/", 1), built, sets) for s in sources},
        "curves": {v: _curve(refs["rl"]) for v, refs in built.items() if "rl" in refs and v in sl["variants"]},
    }


def _curve(rl) -> list[dict]:
    """An RL artifact's training reward per step and dev EM where it was evaluated, continuing the
    curve of the RL artifact it started from, if any (r3rag.training.curves.run_curve): what a
    chart of every run's curve and a stability measure are drawn from."""
    from r3rag.training.curves import run_curve

    return run_curve(rl.path)


def _eval(ev) -> dict:
    """One eval artifact: per system its metrics, policy key and per-question EM and F1."""
    from r3rag.evaluation.tables import em_by_question
    from r3rag.experiments.results.file import policy_key
    from r3rag.util.jsonl import read_jsonl

    rows = read_jsonl(ev.path / "predictions.jsonl")
    em, f1 = em_by_question(rows), em_by_question([{**r, "em": r["f1"]} for r in rows])  # the same averaging
    systems = json.loads((ev.path / "metrics.json").read_text())["systems"]
    out = {}
    for system, metrics in systems.items():
        ids = list(em.get(system, {}))
        out[system] = {
            "metrics": metrics,
            "key": list(policy_key(ev, system)),
            "ids": ids,
            "em": [em[system][q] for q in ids],
            "f1": [f1[system][q] for q in ids],
        }
    return {"artifact": ev.id, "split": ev.manifest["config"].get("split"), "systems": out}


def machine_info() -> dict:
    """The machine a slice ran on: its build minutes mean little without it."""
    import torch

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.+)$", info, re.M).group(1).strip()
        flags = set(re.search(r"^flags\s*:\s*(.+)$", info, re.M).group(1).split())
    except (OSError, AttributeError):  # not Linux: the platform's name for it
        pass
    return {
        "cpu": cpu,
        "arch": platform.machine(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "vector": " ".join(x for x in ("avx2", "avx512f") if x in flags) or None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def machine_line(m: dict) -> str:
    """As r3rag.experiments.experiment.machine, with the CPU's model: `x86_64, 2 cores, AMD EPYC 7B13, no GPU, torch 2.13.0+cpu`."""
    return (
        f"{m.get('arch')}, {m.get('cores')} cores, {m.get('cpu')}, {m.get('gpu') or 'no GPU'}, torch {m.get('torch')}"
    )


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def target_file(folder: Path, name: str, record: dict) -> Path | None:
    """Where this run's file goes: `<name>.json`, unless that records other artifacts of the same
    settings (then `<name>.rerunN.json`); None when a file of this slice already holds these artifacts."""
    first = folder / f"{name}.json"
    for file in sorted(folder.glob(f"{name}.*json")):
        other = _lenient(file)
        if other.get("slice") == name and other.get("artifacts") == record["artifacts"]:
            return None
    old = _lenient(first)
    if not first.exists() or (old and old.get("settings_hash") != record["settings_hash"]):
        return first  # a stale file is replaced: git has it
    n = 2
    while (folder / f"{name}.rerun{n}.json").exists():
        n += 1
    return folder / f"{name}.rerun{n}.json"


def _lenient(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_slice(target: Path, record: dict) -> Path:
    from r3rag.experiments.results.file import write_text_atomic

    return write_text_atomic(target, compact_json(record))


# A list of plain values as json.dumps(indent=2) writes it: "[" and "]" each end or start a line
# (no raw newline is ever inside a JSON string, so none of a string's text can match).
SCALARS = re.compile(r'\[\n\s*(?:[^\[\]{}"\n]|"(?:[^"\\]|\\.)*"|\n)*?\n\s*\]')


def compact_json(data) -> str:
    """Indented JSON with each list of plain values on one line: 500 questions' EM are one line, not 500."""
    text = json.dumps(data, indent=2, default=str)
    return SCALARS.sub(lambda m: json.dumps(json.loads(m.group(0))), text) + "\n"


def commit_line(target: Path, name: str, record: dict) -> str:
    return f"git add -- {target} && git commit -m {_quote(_message(name, record))} -- {target}"


def _message(name: str, record: dict) -> str:
    return f"{record['experiment']}: slice {name}, {record['build_seconds'] / 60:.0f} min on {record['machine']['cpu']}"


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def git_commit(target: Path, name: str, record: dict) -> str:
    """Commit this one file (other files staged or changed stay as they are); its commit's short hash."""
    try:
        subprocess.run(["git", "add", "--", str(target)], check=True, capture_output=True, text=True)
        subprocess.run(
            ["git", "commit", "-m", _message(name, record), "--", str(target)],
            check=True,
            capture_output=True,
            text=True,
        )
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        why = (getattr(e, "stderr", "") or str(e)).strip().splitlines()
        raise UserError(f"{target} is written, but git could not commit it ({why[-1] if why else e})") from None
    return head.stdout.strip()


def load_slice(file: Path) -> dict:
    """A slice file, checked for what the merge reads; one clear line naming the file if it is not one."""
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{file}: not a readable slice file ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UserError(f"{file}: not a slice file (no `kind: {KIND}`)")
    if data.get("schema") != SCHEMA:
        raise UserError(f"{file}: slice file schema {data.get('schema')!r}, this r3rag reads {SCHEMA}")
    for key, kind in REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise UserError(f"{file}: not a slice file ({key!r} missing or of the wrong type)")
    for key in REQUIRED_MAPS:
        if not isinstance(data.get(key), dict):
            raise UserError(f"{file}: not a slice file ({key!r} missing or not a mapping)")
    for variant, ev in data["evals"].items():
        if not isinstance(ev, dict) or not isinstance(ev.get("systems"), dict):
            raise UserError(f"{file}: evals.{variant}: expected a mapping with `systems`")
        for system, s in ev["systems"].items():
            ok = isinstance(s, dict) and isinstance(s.get("metrics"), dict)
            ok = ok and all(isinstance(s["metrics"].get(k), (int, float)) for k in ("em", "f1", "n"))
            if not ok or not all(isinstance(s.get(k), list) for k in ("key", "ids", "em", "f1")):
                raise UserError(
                    f"{file}: evals.{variant}.{system}: expected metrics, key and per-question ids, em and f1"
                )
            if not len(s["ids"]) == len(s["em"]) == len(s["f1"]):
                raise UserError(f"{file}: evals.{variant}.{system}: ids, em and f1 differ in length")
    for source, run in data["runs"].items():
        if not isinstance(run, dict) or not isinstance(run.get("train_seconds"), (int, float)):
            raise UserError(f"{file}: runs.{source}: expected its results entry, with train_seconds")
    return data
