"""Reports over eval artifacts: one table (terminal, Markdown, CSV), a bar chart, and a
self-contained HTML trajectory viewer.

Usage:
    rows = collect_rows([eval_dir, ...])                  # one row per (dataset, system)
    write_markdown(rows, out / "report.md"); write_csv(rows, out / "report.csv")
    plot_bars(rows, out / "em_f1.png")
    write_viewer(eval_dirs, out / "viewer.html")
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

from rich.table import Table

from r3rag.errors import UserError
from r3rag.jsonl import read_json, read_jsonl

COLUMNS = ("dataset", "system", "em", "em_ci", "f1", "f1_ci", "n", "searches", "gold_doc_recall")
OPTIONAL = ("judge_acc", "tokens")  # shown only when some eval has them


def columns(rows: list[dict]) -> tuple[str, ...]:
    return COLUMNS + tuple(c for c in OPTIONAL if any(r.get(c) is not None for r in rows))


def _dataset_name(manifest: dict) -> str:
    world = manifest.get("inputs", {}).get("world", {})
    split = manifest.get("config", {}).get("split", "test")
    return f"{world.get('id', '?')}:{split}"


def collect_rows(eval_dirs: list[Path]) -> list[dict]:
    rows = []
    for d in eval_dirs:
        manifest = read_json(d / "manifest.json")
        metrics = read_json(d / "metrics.json")
        if not isinstance(metrics, dict) or not isinstance(metrics.get("systems"), dict):
            raise UserError(f"{d / 'metrics.json'}: no 'systems' object (not written by `r3rag eval`?)")
        for system, m in metrics["systems"].items():
            rows.append(
                {
                    "dataset": metrics.get("dataset") or _dataset_name(manifest),
                    "system": system,
                    "em": m["em"],
                    "f1": m["f1"],
                    "em_ci": m.get("em_ci"),
                    "f1_ci": m.get("f1_ci"),
                    "n": m["n"],
                    "searches": m.get("searches"),
                    "gold_doc_recall": m.get("gold_doc_recall"),
                    "judge_acc": m.get("judge_acc"),
                    "tokens": m.get("tokens"),
                }
            )
    return rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return f"[{v[0]:.3f}, {v[1]:.3f}]"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def rich_table(rows: list[dict]) -> Table:
    table = Table(title="r3rag report")
    cols = columns(rows)
    for c in cols:
        table.add_column(c, justify="left" if c in ("dataset", "system") else "right")
    for r in rows:
        table.add_row(*(_fmt(r[c]) for c in cols))
    return table


def write_markdown(rows: list[dict], path: Path) -> None:
    cols = columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in rows]
    path.write_text("\n".join(lines) + "\n")


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        cols = columns(rows)
        w.writerow(cols)
        for r in rows:
            w.writerow([_fmt(r[c]) if isinstance(r[c], (list, tuple)) else r[c] for c in cols])


def plot_bars(rows: list[dict], path: Path) -> None:
    """EM and F1 per system, grouped by dataset, with 95% CI whiskers when present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(max(5, 4.5 * len(datasets)), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        sub = [r for r in rows if r["dataset"] == ds]
        xs = range(len(sub))
        for offset, key, color in ((-0.2, "em", "#3b6fb6"), (0.2, "f1", "#e08a2c")):
            vals = [r[key] for r in sub]
            err = [
                [v - (r[f"{key}_ci"] or (v, v))[0] for v, r in zip(vals, sub)],
                [(r[f"{key}_ci"] or (v, v))[1] - v for v, r in zip(vals, sub)],
            ]
            ax.bar([x + offset for x in xs], vals, width=0.4, label=key.upper(), color=color, yerr=err, capsize=3)
        ax.set_xticks(list(xs), [r["system"] for r in sub])
        ax.set_ylim(0, 1.05)
        ax.set_title(ds, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_viewer(eval_dirs: list[Path], path: Path, max_per_system: int = 300) -> int:
    """One HTML file, no external resources: every prediction's turns, retrieved documents
    (gold ones highlighted: class "gold"; gold = listed by id, or by title on real data), answer and correctness; a filter shows only failures."""
    records = []
    for d in eval_dirs:
        counts: dict[str, int] = {}
        for p in read_jsonl(d / "predictions.jsonl", allow_empty=True):
            counts[p["system"]] = counts.get(p["system"], 0) + 1
            if counts[p["system"]] <= max_per_system:
                records.append(
                    {
                        k: p.get(k)
                        for k in (
                            "system",
                            "id",
                            "question",
                            "golden_answers",
                            "answer",
                            "em",
                            "f1",
                            "finish_reason",
                            "turns",
                            "retrieved_docs",
                            "gold_docs",
                        )
                    }
                )
    data = json.dumps(records).replace("</", "<\\/")  # keep "</script>" out of the embedded JSON
    path.write_text(_VIEWER.replace("__DATA__", data).replace("__TITLE__", html.escape(path.stem)))
    return len(records)


_VIEWER = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.q{border:1px solid #ccc;border-radius:6px;margin:0.8em 0;padding:0.6em 0.9em}
.q.ok{border-left:6px solid #2e9d4f}.q.bad{border-left:6px solid #c8372d}
.turn{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:0.85em;margin:0.2em 0}
.model{color:#1f3f7a}.env{color:#555;background:#f6f6f6}
.doc{display:block;margin:0.1em 0}.gold{background:#fff1a8;font-weight:600}
.meta{font-size:0.85em;color:#666}
</style></head><body>
<h1>r3rag trajectories</h1>
<label><input type="checkbox" id="fails"> failures only</label>
<select id="system"></select> <span id="count" class="meta"></span>
<div id="list"></div>
<script>
const DATA = __DATA__;
const esc = s => String(s ?? "").replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\\"":"&quot;"}[c]));
const systems = [...new Set(DATA.map(r => r.system))];
const sel = document.getElementById("system");
sel.innerHTML = '<option value="">all systems</option>' + systems.map(s => `<option>${esc(s)}</option>`).join("");
function renderTurn(t, r, k) {
  if (t.role === "model") return `<div class="turn model">${esc(t.text)}</div>`;
  const docs = k >= 0 ? ((r.retrieved_docs || [])[k] || null) : null;
  if (!docs) return `<div class="turn env">${esc(t.text)}</div>`;
  const gold = new Set(r.gold_docs || []);
  return `<div class="turn env">` + docs.map(d =>
    `<span class="doc${gold.has(d.id) || gold.has(d.title) ? " gold" : ""}" data-doc="${esc(d.id)}">[${esc(d.id)}] ${esc(d.title)}: ${esc(d.text)}</span>`
  ).join("") + `</div>`;
}
function render() {
  const fails = document.getElementById("fails").checked, sys = sel.value;
  const rows = DATA.filter(r => (!fails || !r.em) && (!sys || r.system === sys));
  document.getElementById("count").textContent = `${rows.length} shown`;
  document.getElementById("list").innerHTML = rows.map(r => {
    let k = -1;
    const turns = (r.turns || []).map(t => { if (t.role === "env" && t.text.includes("<information>")) k++; return renderTurn(t, r, k); }).join("");
    return `<div class="q ${r.em ? "ok" : "bad"}"><b>${esc(r.question)}</b>
      <div class="meta">${esc(r.system)} · ${esc(r.id)} · gold: ${esc((r.golden_answers || []).join(" | "))} · answer: ${esc(r.answer)} · EM ${r.em} · ${esc(r.finish_reason)}</div>
      ${turns}</div>`;
  }).join("");
}
document.getElementById("fails").onchange = render; sel.onchange = render; render();
</script></body></html>
"""
