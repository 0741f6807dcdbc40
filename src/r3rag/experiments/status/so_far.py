"""`r3rag run EXPERIMENT --status`: the table and its comparisons over the seeds finished so far.

A three-seed experiment (pipelines/replicate.yaml) runs for days and writes its table and results
file only once every variant and seed is done. Meanwhile `--status` prints the same table from
the eval artifacts that exist: each row over its finished seeds ("2 of 3 seeds" beside the
label), each comparison whose two rows have a finished seed, paired over the same questions as
the final table's. Nothing is written: the figures a reader should quote come from the finished run.

Usage:
    rows, built, experiment = r3rag.experiments.status.stages.file_status(path, overrides, runs_dir)
    print_so_far(path, experiment, built)        # prints nothing while no row has a finished seed
"""

from __future__ import annotations

from pathlib import Path

from r3rag.experiments.results.compare import build_comparisons, comparison_markdown, entry_rows
from r3rag.experiments.results.table import build_rows, markdown, row_sources


def finished_sources(table: dict, built: dict[str, dict]) -> dict[str, list[str]]:
    """{row label: its `<variant>/<system>` sources whose variant's eval is done}, rows with none left out."""
    out = {}
    for label, source in table.items():
        done = [s for s in row_sources(source) if "eval" in built.get(s.partition("/")[0], {})]
        if done:
            out[str(label)] = done
    return out


def print_so_far(path: Path, experiment: dict, built: dict[str, dict]) -> None:
    text = so_far_markdown(path, experiment, built)
    if text:
        print(f"\nResults so far (finished seeds only; written nowhere):\n\n{text}", end="")


def so_far_markdown(path: Path, experiment: dict, built: dict[str, dict]) -> str:
    """The table over the finished seeds, then its comparisons; "" when no row has one."""
    planned = {str(label): len(row_sources(s)) for label, s in experiment["table"].items()}
    table = finished_sources(experiment["table"], built)
    if not table:
        return ""
    rows = build_rows(table, built, path)
    for row in rows:
        done, of = len(table[row["label"]]), planned[row["label"]]
        if done < of:
            row["label"] += f" ({done} of {of} seeds)"
    waiting = [label for label in planned if label not in table]
    text = markdown(rows, None)
    if waiting:
        text += f"\nNo seed finished yet: {'; '.join(waiting)}.\n"
    entries = [(entry_rows(e), e) for e in experiment.get("compare") or []]
    pairs = [rows for rows, _ in entries if rows and all(r in table for r in rows)]
    claims = {rows: e["claim"] for rows, e in entries if rows in pairs and isinstance(e, dict) and e.get("claim")}
    comparisons = build_comparisons(pairs, table, built, claims=claims)
    return text + ("\n" + comparison_markdown(comparisons) if comparisons else "")
