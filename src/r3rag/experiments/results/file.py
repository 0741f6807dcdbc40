"""An experiment's results file: its table as data, every figure the docs show with where it came from.

An experiment (r3rag.experiments.experiment) whose pipeline names a results file writes it after its table
artifact, last, atomically (a temp file renamed into place): a run killed halfway leaves the
previous file whole. The path is relative to the working directory (the repository's root):

    results: results/replicate.json
    results:                                 # or with named subsets of rows, for the docs' blocks
      path: results/replicate.json
      tables:
        headline: [SFT cold start, "SFT + GRPO, outcome reward, 200 steps"]   # row labels of `table`

The file holds `experiment`, `pipeline`, `date`, `machine`, `wall_seconds`, `compute_seconds`,
`table_artifact`, `tables` (name -> row labels; `all` is every row in the table's order) and
`rows`: each row as the table artifact's table.json has it (label, source, em with em_ci, em_sd
and n_seeds for a row over seeds, f1, n, by_hops, searches, train_seconds, eval_seconds) plus
`runs`, one per `<variant>/<system>` behind the row (one per seed for a row over seeds): the
system's test-split metrics from its eval (em and em_ci: exact Clopper-Pearson for 0/1 scores,
else bootstrap, r3rag.core.metrics.mean_ci; f1 and f1_ci; n), the eval split, dev EM where the
experiment has it (an eval on the dev split of the same policy and retriever, else the rl
stage's own dev evaluation), the policy's seed, optimizer steps per trained stage, training and
eval seconds with `compute` (each trained stage's threads and the `run --jobs` workers that shared
the machine, where its manifest records them), the variant's `set` and every setting of its
stages that differs from the default, and its artifact ids. r3rag.experiments.results.docs turns the file into the Markdown blocks of the docs.

Usage:
    spec = results_spec(Path("pipelines/replicate.yaml"), data)   # None, or {"path", "tables"}, checked
    write_results(spec, Path("pipelines/replicate.yaml"), data, built, table_ref)
    results = load_results(Path("results/replicate.json"))
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from r3rag.util.durable import fsync_path
from r3rag.util.errors import UserError

ALL = "all"  # the table name of every row, in the table's order
SCHEMA = 1
TRAINED = ("base", "sft", "rl")  # as r3rag.experiments.results.table: the stages that train a policy


def results_spec(path: Path, data: dict) -> dict | None:
    """The pipeline's `results` setting as {"path": Path, "tables": {name: [labels]}}, checked
    against its table (before anything runs: a typo must not cost a replication's hours)."""
    raw = data.get("results")
    if raw is None or raw == "":
        return None
    raw = {"path": raw} if isinstance(raw, str) else raw
    if not isinstance(raw, dict) or set(raw) - {"path", "tables"} or not isinstance(raw.get("path"), str):
        raise UserError(f"{path}: results: expected a .json path, or a mapping with keys path and tables")
    if not raw["path"].endswith(".json"):
        raise UserError(f"{path}: results: {raw['path']!r} is not a .json file")
    tables = raw.get("tables") or {}
    if not isinstance(tables, dict) or ALL in tables:
        raise UserError(f"{path}: results.tables: expected a mapping of name -> row labels (`{ALL}` is every row)")
    labels = [str(label) for label in data["table"]]
    for name, rows in tables.items():
        if not isinstance(rows, list) or not rows:
            raise UserError(f"{path}: results.tables.{name}: expected a list of row labels of `table`")
        for label in rows:
            if str(label) not in labels:
                raise UserError(f"{path}: results.tables.{name}: {label!r} is not a row label of `table`")
    return {
        "path": Path(raw["path"]),
        "tables": {ALL: labels, **{str(k): [str(x) for x in v] for k, v in tables.items()}},
    }


def write_results(spec: dict, path: Path, data: dict, built: dict, table_ref) -> Path:
    """Write the results file of an experiment whose table artifact is `table_ref`; returns its path."""
    table = json.loads((table_ref.path / "table.json").read_text())
    sets = {name: list((v or {}).get("set") or []) for name, v in (data.get("variants") or {}).items()}
    rows = [{**row, "runs": _runs(row, built, sets)} for row in table["rows"]]
    out = {
        "schema": SCHEMA,
        "experiment": str(data.get("name", "experiment")),
        "pipeline": relative_paths(str(path)),
        **{k: table[k] for k in ("date", "machine", "wall_seconds", "compute_seconds")},
        "table_artifact": table_ref.id,
        "tables": spec["tables"],
        "rows": rows,
        "comparisons": table.get(
            "comparisons", []
        ),  # r3rag.experiments.results.compare: paired, over the same questions
    }
    return write_text_atomic(spec["path"], json.dumps(out, indent=2, default=str) + "\n")


def load_results(path: Path) -> dict:
    """A results file, with one clear line when it is missing or not one."""
    try:
        results = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such results file (an experiment with `results: {path}` writes it)") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable results file ({e})") from None
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list) or "tables" not in results:
        raise UserError(f"{path}: not a results file (no rows and tables)")
    return results


def write_text_atomic(target: Path, text: str) -> Path:
    """Write `target` whole or not at all: a temp file beside it, on disk, renamed into place (a
    results file or a slice file, r3rag.experiments.slices.file, is the record: never half of one)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with open(tmp, "w") as f:  # on disk before the rename: a power cut leaves the old file or the new one
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        fsync_path(target.parent)  # the rename itself on disk too
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _runs(row: dict, built: dict, sets: dict[str, list[str]]) -> list[dict]:
    sources = row["source"] if isinstance(row["source"], list) else [row["source"]]
    return [run_entry(*str(s).split("/", 1), built, sets) for s in sources]


def run_entry(variant: str, system: str, built: dict, sets: dict[str, list[str]]) -> dict:
    """One `<variant>/<system>`: its eval's figures for the system and how its policy was made."""
    from r3rag.experiments.results.table import train_seconds

    refs = built[variant]
    ev = refs["eval"]
    m = json.loads((ev.path / "metrics.json").read_text())["systems"][system]
    trained = [s for s in _policy_stages(system) if s in refs]
    return {
        "variant": variant,
        "system": system,
        "seed": refs[trained[-1]].manifest["config"].get("seed") if trained else None,
        "split": ev.manifest["config"].get("split"),
        "em": m["em"],
        "em_ci": m.get("em_ci"),
        "f1": m["f1"],
        "f1_ci": m.get("f1_ci"),
        "n": m["n"],
        **_dev_em(variant, system, built),
        "steps": {s: refs[s].manifest["metrics"]["steps"] for s in trained if "steps" in refs[s].manifest["metrics"]},
        "train_seconds": train_seconds(system, refs),
        # how each trained stage ran (threads, `run --jobs` workers sharing the machine): its seconds' context
        "compute": {s: refs[s].manifest["compute"] for s in trained if "compute" in refs[s].manifest},
        "eval_seconds": m.get("seconds"),
        "set": sets.get(variant, []),
        "settings": {f"{s}.{k}": v for s, ref in refs.items() for k, v in _non_default(ref).items()},
        "artifacts": {s: ref.id for s, ref in refs.items()},
    }


def _policy_stages(system: str) -> tuple[str, ...]:
    # The RL system answers with the rl policy; every other one (sft, readers) with the sft policy.
    return TRAINED if system.split("@")[0] == "rl" else ("base", "sft")


def _dev_em(variant: str, system: str, built: dict) -> dict:
    """EM on the dev split of the same policy with the same retriever: from another variant's dev
    eval (same sft/rl inputs, same retriever, the same system), else from the rl stage's own dev
    evaluation (`eval_every`, on `eval_limit` dev questions) of an RL system's policy."""
    key = policy_key(built[variant]["eval"], system)
    for name, refs in built.items():
        ev = refs.get("eval")
        if ev is None or ev.manifest["config"].get("split") != "dev":
            continue
        systems = json.loads((ev.path / "metrics.json").read_text())["systems"]
        for label, m in systems.items():
            if policy_key(ev, label) == key:
                return {"dev_em": m["em"], "dev_n": m["n"], "dev_from": f"{name}/{label}"}
    rl = built[variant].get("rl")
    if system.split("@")[0] == "rl" and rl is not None and rl.manifest["metrics"].get("kept_dev_em") is not None:
        return {"dev_em": rl.manifest["metrics"]["kept_dev_em"], "dev_n": None, "dev_from": "rl dev evaluation"}
    return {"dev_em": None, "dev_n": None, "dev_from": None}


def policy_key(ev, label: str) -> tuple:
    """What makes two evals' systems the same model answering the same way: the system's kind,
    the sft and rl artifacts it reads, and the retriever it searches."""
    inputs = ev.manifest["inputs"]
    kind, _, retriever = label.partition("@")
    index = inputs.get(f"retriever:{retriever}") if retriever else inputs.get("index")
    ids = [(inputs.get(s) or {}).get("id") for s in ("sft", "rl")]
    return (kind, *ids, (index or {}).get("id"))


def _non_default(ref) -> dict:
    """The artifact's settings that differ from its stage's defaults (inputs, named by artifact
    id elsewhere in the entry, and the artifact's name left out)."""
    from r3rag.stages import stage_module

    module = stage_module(ref.stage)
    defaults = json.loads(json.dumps(dataclasses.asdict(module.Config()), default=str))
    skip = {"name", *getattr(module, "INPUTS", {})}
    config = ref.manifest["config"]
    return {k: relative_paths(v) for k, v in config.items() if k not in skip and defaults.get(k, object()) != v}


def relative_paths(value):
    """A path under the working directory as a relative one: a committed file names no machine's home."""
    cwd = str(Path.cwd()) + os.sep
    if isinstance(value, str):
        return value.replace(cwd, "")
    if isinstance(value, list):
        return [relative_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: relative_paths(v) for k, v in value.items()}
    return value
