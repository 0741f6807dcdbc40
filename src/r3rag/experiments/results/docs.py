"""Tables in the docs generated from results files: `r3rag report --results` rewrites them.

A generated block in a Markdown file (README.md, docs/*.md, benchmarks/RESULTS.md) sits between
two marker lines; only the text between them is rewritten:

    <!-- r3rag:results results/replicate.json headline chart=docs/replicate.png -->
    | ... the table, as r3rag.experiments.results.table.markdown writes it ... |
    <!-- /r3rag:results -->

The opening marker names a results file (r3rag.experiments.results.file; relative to the repository root,
where `r3rag report` runs) and one of its tables (`all`: every row; other names come from the
pipeline's `results.tables`; `comparisons`: the experiment's paired comparisons,
r3rag.experiments.results.compare; `claims`: the same, each claim a sentence saying whether it stands;
`stability`: each RL row's largest drops below its own best, per seed, from the slices' training
curves, r3rag.training.curves), then options: `chart=PATH` also writes that PNG (EM per row with its
95% interval, r3rag.experiments.results.table.plot; for `stability`, every run's reward and dev EM
per step) from the same rows; `by=searches` makes it EM against the number of searches a question
needs, one line per row (r3rag.experiments.results.table.plot_by_searches: long-horizon worlds). Markers are HTML comments, so neither
GitHub nor MkDocs shows them. Text written by hand between the markers is lost at the next
regeneration; tests/test_results_docs.py fails when the committed text differs from what the
committed results file gives.

Usage:
    r3rag report --results results/replicate.json                 # README.md, docs/*.md, benchmarks/RESULTS.md
    r3rag report --results results/replicate.json --docs README.md
    update_docs(doc_files(root), root, results=[Path("results/replicate.json")])
    stale(Path("README.md"), root)                                 # empty when every block is up to date, else a diff
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from r3rag.experiments.results.file import load_results
from r3rag.util.errors import UserError

OPEN = "<!-- r3rag:results "
CLOSE = "<!-- /r3rag:results -->"
BLOCK = re.compile(
    r"^<!-- r3rag:results (?P<args>[^\n]*?) -->\n(?P<body>.*?)^<!-- /r3rag:results -->$", re.MULTILINE | re.DOTALL
)
OPTIONS = {"chart", "by"}
BY = {"searches"}  # by=searches: the chart draws EM against the searches a question needs, a line per row
COMPARISONS = "comparisons"  # the table name of the paired comparisons (r3rag.experiments.results.compare)
CLAIMS = "claims"  # the same comparisons as sentences: each claim, stands or not
STABILITY = "stability"  # each RL row's largest drops below its best, per seed (r3rag.training.curves)


def doc_files(root: Path) -> list[Path]:
    """The Markdown files that may hold generated blocks: README.md, docs/*.md, benchmarks/RESULTS.md."""
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "benchmarks" / "RESULTS.md"]
    return [f for f in files if f.is_file()]


def parse_marker(args: str, where: str) -> dict:
    """`<file> <table> [chart=PATH]` -> {"file", "table", "chart"}."""
    words = args.split()
    if len(words) < 2 or any("=" in w for w in words[:2]):
        raise UserError(f"{where}: expected `{OPEN}<results file> <table> [chart=PATH] -->`, got {args!r}")
    options = dict(w.partition("=")[::2] for w in words[2:])
    bad = sorted(set(options) - OPTIONS) or [w for w in words[2:] if "=" not in w]
    if bad:
        raise UserError(f"{where}: unknown marker option {bad[0]!r} (known: {', '.join(sorted(OPTIONS))}=...)")
    if options.get("by", "searches") not in BY:
        raise UserError(f"{where}: by={options['by']}: charts know by={', '.join(sorted(BY))}")
    return {"file": words[0], "table": words[1], "chart": options.get("chart"), "by": options.get("by")}


def block_rows(results: dict, table: str, where: str) -> list[dict]:
    """The rows of one of the results file's tables, in that table's order."""
    tables = results["tables"]
    if table not in tables:
        raise UserError(f"{where}: the results file has no table {table!r} (tables: {', '.join(tables)})")
    by_label = {r["label"]: r for r in results["rows"]}
    missing = [label for label in tables[table] if label not in by_label]
    if missing:
        raise UserError(f"{where}: table {table!r} names row {missing[0]!r}, which the results file lacks")
    return [by_label[label] for label in tables[table]]


def render(results: dict, table: str, where: str) -> str:
    """A block's text: the selected rows as the experiment's table.md shows them, with its note."""
    from r3rag.experiments.results.compare import claims_markdown, comparison_markdown
    from r3rag.experiments.results.table import markdown

    if table == COMPARISONS:
        return comparison_markdown(results.get("comparisons") or [])
    if table == CLAIMS:
        return claims_markdown(results.get("comparisons") or [])
    if table == STABILITY:
        return stability_markdown(results, where)
    return markdown(block_rows(results, table, where), results)


def stability_markdown(results: dict, where: str) -> str:
    """Each RL row's largest drop below its own best, per seed: the training reward (a moving
    average over REWARD_WINDOW steps) and dev EM, with the best and last dev EM."""
    from r3rag.training.curves import REWARD_WINDOW

    if not results.get("stability"):
        raise UserError(f"{where}: the results file has no training curves (its slice files predate them)")
    lines = [
        f"| row | seed | reward drop (mean of {REWARD_WINDOW} steps) | dev EM drop | best dev EM | last dev EM |",
        "|---|---|---|---|---|---|",
    ]
    for label, seeds in results["stability"].items():
        for seed, s in sorted(seeds.items()):
            best, last = (f"{v:.3f}" if v is not None else "-" for v in (s["best_dev_em"], s["last_dev_em"]))
            lines.append(f"| {label} | {seed} | {s['reward_drop']:.3f} | {s['dev_em_drop']:.3f} | {best} | {last} |")
    return "\n".join(lines) + "\n"


def regenerate(text: str, name: str, root: Path, only: set[Path] | None = None) -> tuple[str, list[dict]]:
    """`text` with every block (of the results files in `only`, else every one) regenerated, and
    the blocks found (their marker's settings, `where` and `rows`)."""
    _check_pairs(text, name)
    cache: dict[Path, dict] = {}
    blocks: list[dict] = []

    def one(m: re.Match) -> str:
        where = f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        block = {**parse_marker(m.group("args"), where), "where": where}
        source = (root / block["file"]).resolve()
        if only is not None and source not in only:
            return m.group(0)
        if source not in cache:
            cache[source] = load_results(root / block["file"])
        body = render(cache[source], block["table"], where)
        table = block["table"]
        rows = [] if table in (COMPARISONS, CLAIMS, STABILITY) else block_rows(cache[source], table, where)
        blocks.append({**block, "rows": rows, "curves": cache[source].get("curves") if table == STABILITY else None})
        return f"{OPEN}{m.group('args')} -->\n{body}{CLOSE}"

    return BLOCK.sub(one, text), blocks


def _check_pairs(text: str, name: str) -> None:
    """Every opening marker has its closing one, and blocks do not nest: else a regeneration would
    rewrite the text between two unrelated markers."""
    depth = 0
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith(OPEN) or line == CLOSE:
            depth += 1 if line.startswith(OPEN) else -1
            if depth not in (0, 1):
                raise UserError(f"{name}:{i}: {'nested' if depth > 1 else 'unopened'} r3rag:results marker")
    if depth:
        raise UserError(f"{name}: an r3rag:results marker has no closing {CLOSE}")
    opened = [i for i, line in enumerate(text.splitlines(), 1) if line.startswith(OPEN)]
    if len(opened) != len(BLOCK.findall(text)):  # e.g. `-->` missing: the block would be skipped silently
        raise UserError(f"{name}:{opened[0]}: malformed r3rag:results marker (expected `{OPEN}FILE TABLE -->`)")


def stale(path: Path, root: Path) -> str:
    """Empty when every block of `path` is what its results file gives, else a unified diff
    (committed -> generated) and the charts that are missing."""
    name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    text = path.read_text()
    new, blocks = regenerate(text, name, root)
    missing = [
        f"{b['where']}: chart {b['chart']} is missing"
        for b in blocks
        if b["chart"] and not (root / b["chart"]).is_file()
    ]
    diff = difflib.unified_diff(
        text.splitlines(True), new.splitlines(True), f"{name} (committed)", f"{name} (generated)"
    )
    return "".join(diff) + "".join(line + "\n" for line in missing)


def update_docs(paths: list[Path], root: Path, results: list[Path] | None = None) -> tuple[list[Path], int]:
    """Regenerate the blocks (of `results` files, else all) in `paths` and write their charts;
    returns the files written (a Markdown file only when its text changed) and the blocks found.
    Nothing is written when two blocks would draw different charts to the same file."""
    from r3rag.experiments.results.table import plot, plot_by_searches

    only = {(root / r).resolve() for r in results} if results else None
    regenerated = [(path, *regenerate(path.read_text(), str(path), root, only)) for path in paths]
    charts = _charts([b for _, _, blocks in regenerated for b in blocks])
    written = []
    for path, new, _ in regenerated:
        if new != path.read_text():
            path.write_text(new)
            written.append(path)
    for chart, block in charts.items():
        (root / chart).parent.mkdir(parents=True, exist_ok=True)
        if block["curves"] is not None:  # a stability block: every run's reward and dev EM per step
            from r3rag.training.curves import plot_curves

            plot_curves(block["curves"], root / chart, title="training reward and dev EM per step")
        elif block["by"] == "searches":
            plot_by_searches(block["rows"], root / chart)
        else:
            plot(block["rows"], root / chart)
        written.append(root / chart)
    return written, sum(len(blocks) for _, _, blocks in regenerated)


def _charts(blocks: list[dict]) -> dict[str, dict]:
    """Each chart path with the block that draws it; two blocks naming one path with other rows would
    leave the chart of whichever ran last (the docs' order), so that is an error naming both."""
    charts: dict[str, dict] = {}
    for b in (b for b in blocks if b["chart"]):
        first = charts.setdefault(b["chart"], b)
        if (first["file"], first["table"], first["by"]) != (b["file"], b["table"], b["by"]):
            raise UserError(
                f"{b['where']}: chart {b['chart']} is also drawn by {first['where']} "
                f"from table {first['table']!r}: name another file for one of them"
            )
    return charts
