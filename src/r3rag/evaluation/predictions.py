"""Evaluation rows and their summary: what `r3rag eval` records per question and per system.

A prediction row holds the answer, EM/F1/cover, finish reason, searches, model tokens,
gold-document recall (r3rag.core.gold_docs: by doc id on the synthetic world, by title on real data),
the question's hop count, type and source dataset (`metadata.dataset`), and the whole
trajectory (for the viewer). A summary averages over samples per question first, so intervals
are over questions (exact Clopper-Pearson for 0/1 scores, bootstrap otherwise); `by_dataset`
gives EM/F1/cover with their intervals per dataset (a mixed question file, e.g. HotpotQA +
2Wiki + MuSiQue, scored in one eval).

Usage:
    rows = [to_prediction("sft", traj, question, sample=0) for ...]
    summary = summarize(rows)     # em, f1, cover, em_ci, f1_ci, searches, tokens, by_hops, by_type, by_dataset, ...
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from r3rag.core.artifacts import FILE, ArtifactRef, load_manifest
from r3rag.core.gold_docs import flat, gold_docs
from r3rag.core.metrics import cover_match, exact_match, f1_score, mean_ci


def to_prediction(system: str, traj, q: dict, sample: int = 0) -> dict:
    gold = q["golden_answers"]
    meta = q.get("metadata", {})
    return {
        "system": system,
        "id": q["id"],
        "sample": sample,
        "question": q["question"],
        "golden_answers": gold,
        "answer": traj.answer,
        "em": exact_match(traj.answer, gold),
        "f1": f1_score(traj.answer, gold),
        "cover": cover_match(traj.answer, gold),
        "finish_reason": traj.finish_reason,
        "searches": len(traj.retrieved),
        "hops": meta.get("hops"),
        "type": meta.get("type"),
        "dataset": meta.get("dataset"),
        "tokens": _model_tokens(traj),
        "gold_doc_recall": gold_recall(traj, q),
        "turns": [{"role": t.role, "text": t.text} for t in traj.turns],
        "retrieved_docs": traj.documents,
        "gold_docs": list(docs.names) if (docs := gold_docs(q)) else [],
    }


def _model_tokens(traj) -> int | None:
    turns = [t for t in traj.turns if t.role == "model"]
    return sum(len(t.ids) for t in turns) if turns and all(t.ids is not None for t in turns) else None


def gold_recall(traj, question: dict) -> float | None:
    """Share of the question's gold documents retrieved at any step (r3rag.core.gold_docs: ids when
    the data has them, else titles); None when it names none."""
    gold = gold_docs(question)
    return None if gold is None else gold.recall(flat(traj.documents))


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 4) if xs else None


def summarize(rows: list[dict]) -> dict:
    per_q: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        per_q[r["id"]].append(r)
    qs = list(per_q.values())
    scores = _scores(qs)
    out = {
        "em": scores["em"] or 0.0,
        "f1": scores["f1"] or 0.0,
        "cover": scores["cover"] or 0.0,
        "n": len(qs),
        "samples": len(rows) // max(len(qs), 1),
        "em_ci": scores["em_ci"],
        "f1_ci": scores["f1_ci"],
        "cover_ci": scores["cover_ci"],
        "searches": _mean([r["searches"] for r in rows]) or 0.0,
        "tokens": _mean([r["tokens"] for r in rows]),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in rows)),
        "gold_doc_recall": _mean([r["gold_doc_recall"] for r in rows]),
        "by_hops": _breakdown(rows, "hops"),
        "by_type": _breakdown(rows, "type"),
        "by_dataset": _by_dataset(rows),
    }
    if out["samples"] > 1:
        out["em_any"] = _mean([float(any(r["em"] for r in rs)) for rs in qs])
    if any("judge" in r for r in rows):
        out["judge_acc"] = _mean([float(r["judge"]) for r in rows])
    return out


def _breakdown(rows: list[dict], key: str) -> dict:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get(key) is not None:
            groups[str(r[key])].append(r)
    return {
        g: {"em": _mean([r["em"] for r in rs]), "f1": _mean([r["f1"] for r in rs]), "n": len({r["id"] for r in rs})}
        for g, rs in sorted(groups.items())
    }


def _by_dataset(rows: list[dict]) -> dict:
    """EM/F1/cover per source dataset, each with a 95% interval over its questions."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("dataset") is not None:
            groups[str(r["dataset"])].append(r)
    out = {}
    for name, rs in sorted(groups.items()):
        per_q: dict[str, list[dict]] = defaultdict(list)
        for r in rs:
            per_q[r["id"]].append(r)
        out[name] = {"n": len(per_q), **_scores(list(per_q.values()))}
    return out


def _scores(per_question: list[list[dict]]) -> dict:
    """EM, F1 and cover, each averaged over a question's samples first (so an interval is over
    questions), with their 95% intervals: exact binomial for 0/1 scores, else bootstrap (mean_ci)."""
    out: dict = {}
    for key in ("em", "f1", "cover"):
        values = [sum(float(r[key]) for r in rows) / len(rows) for rows in per_question]
        out[key], out[f"{key}_ci"] = _mean(values), mean_ci(values)
    return out


def stage_seconds(inputs: dict[str, ArtifactRef]) -> dict:
    """Wall seconds of every upstream stage, found by walking the input manifests."""
    seconds: dict[str, float] = {}
    todo = [r for r in inputs.values() if r.stage != FILE]
    while todo:
        ref = todo.pop()
        seconds.setdefault(ref.stage, ref.manifest.get("seconds", 0.0))
        for inp in ref.manifest.get("inputs", {}).values():
            m = load_manifest(Path(inp["path"])) if inp.get("stage") != FILE else None
            if m:
                todo.append(ArtifactRef(inp["stage"], inp["id"], Path(inp["path"]), m))
    order = ("model", "world", "index", "synthesize", "base", "sft", "rl")
    return {s: seconds[s] for s in order if s in seconds}


EVAL_NARROW_DROPS = ("q/s", "tokens", "F1", "searches")  # left out in this order where the terminal is narrow


def print_table(metrics: dict, console) -> None:
    """The eval's table; in a terminal too narrow for every column, q/s, tokens, F1 and searches
    are left out in that order and named under it (metrics.json has them), never cut to "…"."""
    from r3rag.evaluation.report import natural_width

    systems = metrics["systems"]
    hop_keys = sorted({h for m in systems.values() for h in m.get("by_hops", {})}, key=str)[:4]
    cols = ["system", "EM", "F1", "n", "searches", "tokens", "q/s"] + [f"{h}-hop EM" for h in hop_keys]
    if any("judge_acc" in m for m in systems.values()):
        cols.insert(3, "judge")
    fmt = lambda v, spec=".3f": "-" if v is None else format(v, spec)  # noqa: E731
    rows = []
    for name, m in systems.items():
        row = {
            "system": name,
            "EM": fmt(m["em"]),
            "F1": fmt(m["f1"]),
            "n": str(m["n"]),
            "judge": fmt(m.get("judge_acc")),
            "searches": fmt(m["searches"], ".2f"),
            "tokens": fmt(m.get("tokens"), ".1f"),
            "q/s": fmt(m.get("questions_per_s"), ".1f"),
        }
        hops = m.get("by_hops", {})
        row.update({f"{h}-hop EM": fmt(hops[h]["em"]) if h in hops else "-" for h in hop_keys})
        rows.append(row)
    left_out: list[str] = []
    table = _eval_table(metrics, rows, cols)
    for drop in EVAL_NARROW_DROPS:
        if natural_width(table) <= console.width:
            break
        left_out.append(drop)
        table = _eval_table(metrics, rows, [c for c in cols if c not in left_out])
    if left_out:
        table.caption = (
            f"left out for the terminal's width: {', '.join(left_out)} (the artifact's metrics.json has them)"
        )
    console.print(table)
    secs = metrics.get("seconds", {})
    if secs:
        console.print("seconds per stage: " + ", ".join(f"{k} {v:.0f}" for k, v in secs.items()))


def _eval_table(metrics: dict, rows: list[dict], cols: list[str]):
    from rich.table import Table  # here, not at the top: `r3rag eval --help` imports this module

    table = Table(title=f"evaluation: {metrics.get('dataset', 'held-out questions')}")
    for col in cols:
        table.add_column(col, justify="right" if col != "system" else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(row[c] for c in cols))
    return table
