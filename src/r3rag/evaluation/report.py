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
from typing import TYPE_CHECKING

from r3rag.util.errors import UserError
from r3rag.util.extras import pyplot
from r3rag.util.jsonl import read_json, read_jsonl

if TYPE_CHECKING:
    from rich.table import Table

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


# Left out, in this order, while the table is wider than the terminal; report.md keeps them all.
# dataset, system, em, f1 and n always stay.
NARROW_DROPS = ("em_ci", "f1_ci", "tokens", "gold_doc_recall", "searches", "judge_acc")


def rich_table(rows: list[dict], width: int | None = None) -> Table:
    """The table for a terminal. Given its `width`, the columns that do not fit are left out
    (intervals first) and named in the caption, rather than every cell cut to "data…"."""
    cols = columns(rows)
    table = _table(rows, cols, ())
    if width is None:
        return table
    for drop in NARROW_DROPS:
        if natural_width(table) <= width:
            break
        if drop in cols:
            cols = tuple(c for c in cols if c != drop)
            table = _table(rows, cols, tuple(c for c in columns(rows) if c not in cols))
    return table


def _table(rows: list[dict], cols: tuple[str, ...], dropped: tuple[str, ...]) -> Table:
    from rich.table import Table  # here, not at the top: `r3rag report --help` imports this module

    caption = f"left out for the terminal's width: {', '.join(dropped)} (report.md has them)" if dropped else None
    table = Table(title="r3rag report", caption=caption)
    for c in cols:
        # fold, not "…": a cell still too wide for the terminal wraps, its digits all shown
        table.add_column(c, justify="left" if c in ("dataset", "system") else "right", overflow="fold")
    for r in rows:
        table.add_row(*(_fmt(r[c]) for c in cols))
    return table


def natural_width(table: Table) -> int:
    """The table's width with room to spare: every cell on one line."""
    from rich.console import Console

    console = Console(width=10_000)
    return console.measure(table).maximum


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
    plt = pyplot("r3rag report (em_f1.png)")

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


VIEWER_FIELDS = (
    "system",
    "id",
    "sample",
    "question",
    "golden_answers",
    "answer",
    "em",
    "f1",
    "finish_reason",
    "dataset",
    "turns",
    "retrieved_docs",
    "gold_docs",
)


def _eval_dataset(eval_dir: Path) -> str:
    """The data set of an eval's questions, for prediction rows that do not name their own."""
    if (eval_dir / "metrics.json").is_file():
        metrics = read_json(eval_dir / "metrics.json")
        if isinstance(metrics, dict) and metrics.get("dataset"):
            return str(metrics["dataset"])
    if (eval_dir / "manifest.json").is_file():
        return _dataset_name(read_json(eval_dir / "manifest.json"))
    return eval_dir.name


def write_viewer(eval_dirs: list[Path], path: Path, max_per_system: int = 300) -> int:
    """One HTML file, no external resources, grouped by question: every system's trajectory side
    by side (turns, retrieved documents with the gold ones highlighted: class "gold"; gold = listed
    by id, or by title on real data; answer, EM), filters by outcome and by data set, and it opens
    on a question where the systems disagree. The filters and the question live in the page's URL
    fragment (`#dataset=...&outcome=disagree|all-correct|all-wrong|correct:SYSTEM|wrong:SYSTEM&q=...`),
    so a link opens the same view.

    Keeps the first `max_per_system` questions of each eval (file order) with every system's rows
    for them: with one sample per question, that many trajectories per system. The page counts
    against every question of the evals ("300 of 400 questions shown"), so a cut one is visible.
    A system that appears in several evals gets one column per eval, labelled
    `system (eval directory)`. Returns the number of trajectories in the page."""
    evals = [(d, read_jsonl(d / "predictions.jsonl", allow_empty=True)) for d in eval_dirs]
    evals_of: dict[str, set[str]] = {}
    for d, preds in evals:
        for p in preds:
            evals_of.setdefault(p["system"], set()).add(str(d))
    records = []
    questions: set[tuple] = set()  # (data set, id), as the page groups them, kept or not
    for d, preds in evals:
        dataset = _eval_dataset(d)
        questions.update((p.get("dataset") or dataset, p.get("id")) for p in preds)
        kept: set = set()
        for p in preds:
            if p.get("id") not in kept:
                if len(kept) >= max_per_system:
                    continue
                kept.add(p.get("id"))
            record = {k: p.get(k) for k in VIEWER_FIELDS}
            record["dataset"] = record["dataset"] or dataset
            record["column"] = p["system"] if len(evals_of[p["system"]]) == 1 else f"{p['system']} ({d.name})"
            records.append(record)
    data = json.dumps(records).replace("</", "<\\/")  # keep "</script>" out of the embedded JSON
    page = _VIEWER.replace("__TITLE__", html.escape(path.stem)).replace("__TOTAL__", str(len(questions)))
    path.write_text(page.replace("__DATA__", data))  # the data last: no placeholder is looked for inside it
    return len(records)


_VIEWER = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0;color:#222;height:100vh;display:flex;flex-direction:column}
header{padding:0.6em 1em;border-bottom:1px solid #ddd;display:flex;flex-wrap:wrap;gap:0.8em;align-items:center}
header h1{font-size:1.15em;margin:0}
main{flex:1;display:flex;min-height:0}
#questions{width:30%;min-width:16em;overflow-y:auto;border-right:1px solid #ddd}
#detail{flex:1;overflow:auto;padding:0.8em 1em}
.item{display:flex;gap:0.5em;align-items:baseline;padding:0.35em 0.7em;cursor:pointer;border-bottom:1px solid #f0f0f0;font-size:0.85em}
.item span{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.item:hover{background:#f4f7fb}.item.sel{background:#dfe9f7}
.marks{flex:none;white-space:nowrap}
.m{display:inline-block;width:0.8em;height:0.8em;border-radius:2px;background:#ccc;margin-right:2px}
.m.ok{background:#2e9d4f}.m.bad{background:#c8372d}.m.mixed{background:#e0a32c}.m.none{background:#eee}
h2{font-size:1.05em;margin:0 0 0.2em}
.cols{display:grid;gap:0.8em;margin-top:0.8em}
.sys{border:1px solid #ccc;border-radius:6px;padding:0.5em 0.7em;min-width:0}
.sys.ok{border-top:6px solid #2e9d4f}.sys.bad{border-top:6px solid #c8372d}.sys.mixed{border-top:6px solid #e0a32c}
.sys h3{font-size:0.95em;margin:0 0 0.3em}
.traj+.traj{border-top:1px dashed #ccc;margin-top:0.5em;padding-top:0.5em}
.turn{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:0.8em;margin:0.2em 0;overflow-wrap:anywhere}
.model{color:#1f3f7a}.env{color:#555;background:#f6f6f6}
.doc{display:block;margin:0.1em 0}.gold{background:#fff1a8;font-weight:600}
.meta{font-size:0.85em;color:#666}
.tag{background:#e0a32c;color:#fff;border-radius:3px;padding:0 0.3em}
</style></head><body>
<header><h1>r3rag trajectories</h1>
<label>data set <select id="dataset"></select></label>
<label>outcome <select id="outcome"></select></label>
<button id="prev" title="previous question (k)">&uarr;</button><button id="next" title="next question (j)">&darr;</button>
<span id="count" class="meta"></span>
<span class="meta"><i class="m ok"></i> correct (exact match) <i class="m bad"></i> wrong <i class="m mixed"></i> some samples right</span>
</header>
<main><nav id="questions"></nav><section id="detail"></section></main>
<script>
const DATA = __DATA__;
const TOTAL = __TOTAL__;  // questions in the evals, including those past the page's cap
const $ = id => document.getElementById(id);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const norm = s => String(s ?? "").trim().toLowerCase();
const columns = [...new Set(DATA.map(r => r.column || r.system))];
const groups = [], byKey = new Map();
for (const r of DATA) {  // one group per question: (data set, id)
  const key = `${r.dataset ?? ""}/${r.id}`;
  let g = byKey.get(key);
  if (!g) {
    g = {key, id: r.id, dataset: r.dataset ?? "", question: r.question, gold: r.golden_answers || [], rows: {}};
    byKey.set(key, g); groups.push(g);
  }
  (g.rows[r.column || r.system] ||= []).push(r);
}
// A system's outcome on a question: ok (every sample right), bad (none), mixed, none (not evaluated on it).
const outcome = rs => {
  if (!rs) return "none";
  const right = rs.filter(r => r.em > 0).length;
  return right === rs.length ? "ok" : right === 0 ? "bad" : "mixed";
};
for (const g of groups) {
  g.out = Object.fromEntries(columns.map(c => [c, outcome(g.rows[c])]));
  g.disagree = new Set(columns.map(c => g.out[c]).filter(o => o !== "none")).size > 1;
}
const datasets = [...new Set(groups.map(g => g.dataset))];
$("dataset").innerHTML = `<option value="">all (${groups.length})</option>` +
  datasets.map(d => `<option value="${esc(d)}">${esc(d)} (${groups.filter(g => g.dataset === d).length})</option>`).join("");
$("outcome").innerHTML = [["", "any"], ["disagree", "systems disagree"], ["all-correct", "every system correct"],
  ["all-wrong", "every system wrong"], ...columns.flatMap(c => [["correct:" + c, c + " correct"], ["wrong:" + c, c + " wrong"]])]
  .map(([v, t]) => `<option value="${esc(v)}">${esc(t)}</option>`).join("");
function matches(g, o) {
  if (!o) return true;
  if (o === "disagree") return g.disagree;
  const outs = columns.map(c => g.out[c]).filter(x => x !== "none");
  if (o === "all-correct") return outs.every(x => x === "ok");
  if (o === "all-wrong") return outs.every(x => x === "bad");
  const i = o.indexOf(":"), kind = o.slice(0, i), col = o.slice(i + 1);
  return kind === "correct" ? g.out[col] === "ok" : g.out[col] === "bad" || g.out[col] === "mixed";
}
const state = {dataset: "", outcome: "", q: null};
function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  $("dataset").value = p.get("dataset") || ""; $("outcome").value = p.get("outcome") || "";
  state.dataset = $("dataset").value; state.outcome = $("outcome").value; state.q = p.get("q");
}
function writeHash() {
  const p = new URLSearchParams();
  for (const k of ["dataset", "outcome", "q"]) if (state[k]) p.set(k, state[k]);
  try { history.replaceState(null, "", "#" + p.toString()); } catch (e) { /* file:// in some browsers */ }
}
const marks = g => `<span class="marks">` + columns.map(c => `<i class="m ${g.out[c]}" title="${esc(c)}: ${g.out[c]}"></i>`).join("") + `</span>`;
function renderDocs(docs, r, label) {
  const ids = new Set(r.gold_docs || []), titles = new Set((r.gold_docs || []).map(norm));
  return `<div class="turn env">${label ? `<div class="meta">${label}</div>` : ""}` + docs.map(d =>
    `<span class="doc${ids.has(d.id) || titles.has(norm(d.title)) ? " gold" : ""}" data-doc="${esc(d.id)}">[${esc(d.id)}] ${esc(d.title)}: ${esc(d.text)}</span>`
  ).join("") + `</div>`;
}
function renderTrajectory(r, sample) {
  const docs = r.retrieved_docs || [], turns = r.turns || [];
  // Which env turns hold a search's documents (the others are prefills): <information> blocks, or
  // what follows R3-RAG's "The retrieval documents:". Searches without a turn were in the prompt.
  const isDocs = turns.map((t, i) => t.role === "env" && (t.text.includes("<information>") ||
    (i > 0 && turns[i - 1].role === "model" && /The retrieval documents:\s*$/.test(turns[i - 1].text))));
  let k = Math.max(0, docs.length - isDocs.filter(Boolean).length);
  const inPrompt = docs.slice(0, k).map(d => renderDocs(d, r, "documents in the prompt")).join("");
  const body = turns.map((t, i) => t.role === "model" ? `<div class="turn model">${esc(t.text)}</div>`
    : isDocs[i] && k < docs.length ? renderDocs(docs[k++], r) : `<div class="turn env">${esc(t.text)}</div>`).join("");
  const f1 = typeof r.f1 === "number" ? r.f1.toFixed(2) : esc(r.f1);
  return `<div class="traj"><div class="meta">${sample >= 0 ? `sample ${sample} · ` : ""}answer: <b>${esc(r.answer)}</b> · EM ${esc(r.em)} · F1 ${f1} · ${esc(r.finish_reason)}</div>${inPrompt}${body}</div>`;
}
const LABEL = {ok: "&#10003; correct", bad: "&#10007; wrong", mixed: "some samples right"};
function renderGroup(g) {
  const cols = columns.filter(c => g.rows[c]);
  return `<div class="qhead"><h2>${esc(g.question)}</h2><div class="meta">${esc(g.dataset)} · ${esc(g.id)} · gold: <b>${esc(g.gold.join(" | "))}</b>` +
    `${g.disagree ? ' · <span class="tag">systems disagree</span>' : ""}</div></div>` +
    `<div class="cols" style="grid-template-columns:repeat(${cols.length},minmax(18em,1fr))">` +
    cols.map(c => `<div class="sys ${g.out[c]}" data-system="${esc(c)}"><h3>${esc(c)} <span class="meta">${LABEL[g.out[c]]}</span></h3>` +
      g.rows[c].map((r, i, rs) => renderTrajectory(r, rs.length > 1 ? (r.sample ?? i) : -1)).join("") + `</div>`).join("") + `</div>`;
}
let shown = [];
function render() {
  shown = groups.filter(g => (!state.dataset || g.dataset === state.dataset) && matches(g, state.outcome));
  if (!shown.some(g => g.key === state.q)) state.q = (shown.find(g => g.disagree) || shown[0] || {}).key ?? null;
  $("count").textContent = `${shown.length} of ${TOTAL} questions shown · systems disagree on ${groups.filter(g => g.disagree).length}`;
  $("questions").innerHTML = shown.map(g =>
    `<div class="item${g.key === state.q ? " sel" : ""}" data-key="${esc(g.key)}">${marks(g)}<span>${esc(g.question)}</span></div>`).join("");
  const g = byKey.get(state.q);
  $("detail").innerHTML = g ? renderGroup(g) : `<p class="meta">no question matches these filters</p>`;
  writeHash();
  const sel = $("questions").querySelector(".sel");
  if (sel) sel.scrollIntoView({block: "nearest"});
}
function step(d) {
  const i = shown.findIndex(g => g.key === state.q);
  if (shown.length) { state.q = shown[Math.min(shown.length - 1, Math.max(0, i + d))].key; render(); }
}
$("questions").onclick = e => { const it = e.target.closest(".item"); if (it) { state.q = it.dataset.key; render(); } };
$("dataset").onchange = () => { state.dataset = $("dataset").value; render(); };
$("outcome").onchange = () => { state.outcome = $("outcome").value; render(); };
$("prev").onclick = () => step(-1); $("next").onclick = () => step(1);
document.addEventListener("keydown", e => {
  if (e.target.tagName === "SELECT") return;
  if (e.key === "j" || e.key === "ArrowDown") { step(1); e.preventDefault(); }
  if (e.key === "k" || e.key === "ArrowUp") { step(-1); e.preventDefault(); }
});
window.addEventListener("hashchange", () => { readHash(); render(); });
readHash(); render();
</script></body></html>
"""
