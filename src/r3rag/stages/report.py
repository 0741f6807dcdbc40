"""`r3rag report`: one table over several eval artifacts, plus a bar chart and a trajectory viewer.

Writes `report.md`, `report.csv`, `em_f1.png` (EM/F1 per system and dataset, 95%
intervals as whiskers) and `viewer.html` (one self-contained file grouped by question: every
system's steps, queries, retrieved documents with the gold ones highlighted, answer and whether
it is right, side by side; filters by outcome and by data set; it opens on a question where the
systems disagree), and prints the table: in a narrow terminal without the columns that do not fit
(the intervals first), named under it.

Usage:

    r3rag report                                  # the newest eval artifact
    r3rag report eval:latest runs/eval/demo-abc123 --name compare
    r3rag report --screenshot                     # + viewer.png (needs chromium)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from r3rag.core.artifacts import resolve
from r3rag.evaluation.report import collect_rows, plot_bars, rich_table, write_csv, write_markdown, write_viewer
from r3rag.stages.common import Context
from r3rag.util.errors import UserError

INPUTS: dict[str, str] = {}  # the eval artifacts come as a list: see `evals`


@dataclass
class Config:
    name: str = "default"  # the artifact's name: runs/report/<name>-<hash>
    evals: list[str] = field(default_factory=lambda: ["eval:latest"])  # evals in one table and viewer
    max_per_system: int = 300  # questions per eval in the viewer, with every system (= trajectories per system)
    screenshot: bool = False  # also write viewer.png with headless Chromium


def run(cfg: Config, ctx: Context):
    if not cfg.evals:
        raise UserError("report: give at least one eval artifact")
    refs = [resolve(r, "eval", ctx.runs_dir) for r in cfg.evals]
    inputs = {f"eval{i}": ref for i, ref in enumerate(refs)}
    writer = ctx.writer("report", cfg, inputs, {"evals": "eval"})
    rows = collect_rows([r.path for r in refs])
    if writer.existing:
        ctx.console.print(rich_table(rows, ctx.console.width))
        return ctx.skipped(writer)
    with writer:
        write_markdown(rows, writer.dir / "report.md")
        write_csv(rows, writer.dir / "report.csv")
        plot_bars(rows, writer.dir / "em_f1.png")
        n = write_viewer([r.path for r in refs], writer.dir / "viewer.html", cfg.max_per_system)
        if cfg.screenshot:
            from r3rag.evaluation.browser import screenshot

            screenshot(writer.dir / "viewer.html", writer.dir / "viewer.png")
        writer.metrics.update({"rows": len(rows), "viewer_trajectories": n})
    ctx.console.print(rich_table(rows, ctx.console.width))  # after every input file was read: a broken one fails alone
    return ctx.done(writer)
