"""`r3rag run FILE --status` for an experiment with slices: which are committed, which are left.

Per slice (r3rag.experiments.slices.cut), from its files (r3rag.experiments.slices.file) and git,
not from the runs directory (a new machine has none): `committed` (its current file is in git's
HEAD, unchanged), `written` (the file is there but not committed yet: commit it before the machine
can go), `stale` (its file records other settings: rerun it), `missing`. A committed slice shows
its build minutes from nothing and the machine; one over ~100 min
(r3rag.experiments.slices.cut.MAX_MINUTES) is marked, to be split. The hours left are each slice
not yet done, at the median build minutes of the committed slices of its kind (the same name
before `{seed}` is filled) where there are, else at the pipeline's `minutes` estimate; each
counted from nothing, so where one machine runs several slices that share a cold start the real
time is less. Then the table and comparisons over the slices there are (rows over the seeds done
say "1 of 3 seeds"), from the files: the interim figures that outlive a machine.

Usage:
    rows = slice_rows(path, load_pipeline(path))       # [] when the pipeline declares no slices
    print_slice_status(path, load_pipeline(path))
"""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from r3rag.experiments.slices.cut import MAX_MINUTES


def slice_rows(path: Path, data: dict) -> list[dict]:
    """One row per slice: {"slice", "kind", "state", "detail", "minutes" (recorded or estimated), "estimated"}."""
    from r3rag.experiments.slices.file import machine_line
    from r3rag.experiments.slices.merge import collect

    if not data.get("slices"):
        return []
    found = collect(path, data)
    in_git = _committed(found["folder"])
    done = {name: record for name, (_, record) in found["current"].items()}
    rows = []
    for name, sl in found["slices"].items():
        row = {"slice": name, "kind": sl["kind"]}
        if name in found["current"]:
            file, record = found["current"][name]
            minutes = record["build_seconds"] / 60
            state = "committed" if in_git is not None and file.name in in_git else "written"
            detail = f"{file}, {record['finished'][:10]}, {minutes:.0f} min on {machine_line(record['machine'])}"
            if minutes > MAX_MINUTES:
                detail += f"; over the ~{MAX_MINUTES} min a slice may take: split it"
            if state == "written":
                detail += "; not committed yet" if in_git is not None else "; not in a git repository"
            rows.append({**row, "state": state, "detail": detail, "minutes": minutes, "estimated": False})
            continue
        minutes, how = _estimate(sl, done)
        stale = found["stale"].get(name)
        state = "stale" if stale else "missing"
        detail = f"{stale[0][0]}: {stale[0][2]}; " if stale else ""
        detail += f"~{minutes:.0f} min ({how})" if minutes is not None else "no estimate"
        rows.append({**row, "state": state, "detail": detail, "minutes": minutes, "estimated": True})
    return rows


def _estimate(sl: dict, done: dict[str, dict]) -> tuple[float | None, str]:
    same = [r["build_seconds"] / 60 for r in done.values() if r.get("slice_kind") == sl["kind"]]
    if same:
        return statistics.median(same), f"as {len(same)} finished {sl['kind']}"
    if sl["minutes"] is not None:
        return float(sl["minutes"]), "the pipeline's estimate"
    return None, ""


def _committed(folder: Path) -> set[str] | None:
    """The names of the folder's files that git's HEAD holds and the working tree has not changed;
    None where the folder is not in a git repository (or git is missing)."""
    if not folder.is_dir():
        return set()

    def git(*args: str) -> set[str]:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True)
        return {Path(p).name for p in out.stdout.split("\0") if p}

    try:
        head = git("ls-tree", "-z", "--name-only", "HEAD", "--", ".")
        changed = git("diff", "-z", "--name-only", "--relative", "HEAD", "--", ".")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head - changed


def print_slice_status(path: Path, data: dict) -> None:
    from r3rag.experiments.status.stages import print_states

    rows = slice_rows(path, data)
    if not rows:
        return
    style = {"committed": "green", "written": "yellow", "stale": "red", "missing": "bold"}
    console, counts = print_states(f"{path}: slices", "slice", rows, style)
    left = [r for r in rows if r["estimated"]]
    hours = sum(r["minutes"] for r in left if r["minutes"] is not None) / 60
    unknown = sum(r["minutes"] is None for r in left)
    line = ", ".join(f"{n} {s}" for s, n in counts.items()) + f" (of {len(rows)} slices)"
    if left:
        line += f"; ~{hours:.1f} h of build left, each slice from nothing"
        line += f" ({unknown} without an estimate)" if unknown else ""
    console.print(line)
    print(so_far(path, data), end="")


def so_far(path: Path, data: dict) -> str:
    """The table, its comparisons and its claims over the slices with a current file ("" while none has one)."""
    from r3rag.experiments.results.compare import claims_markdown, comparison_markdown
    from r3rag.experiments.results.table import markdown, row_sources
    from r3rag.experiments.slices.merge import merge

    merged = merge(path, data, partial=True)
    if not merged["rows"]:
        return ""
    from r3rag.experiments.seeds import expand_seeds

    planned = {str(k): len(row_sources(v)) for k, v in expand_seeds(path, data)["table"].items()}
    for row in merged["rows"]:
        done = len(row_sources(row["source"]))
        if done < planned[row["label"]]:
            row["label"] += f" ({done} of {planned[row['label']]} seeds)"
    text = markdown(merged["rows"], None) + "\n" + comparison_markdown(merged["comparisons"])
    if merged["comparisons"]:  # the seeds column says how many seeds each claim rests on so far
        text += "\nThe claims so far:\n\n" + claims_markdown(merged["comparisons"])
    return f"\nResults so far, from the slice files (written nowhere; `r3rag report --results` merges all):\n\n{text}"
