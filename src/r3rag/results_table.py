"""An experiment's results table (see r3rag.experiment): rows from eval artifacts, as Markdown.

Usage:
    rows = build_rows({"SFT": "main/sft"}, {"main": {"sft": ref, "eval": ref}}, path)
    print(markdown(rows, {"date": "...", "machine": "...", "wall_seconds": 1.0, "compute_seconds": 2.0}))
    plot(rows, Path("table.png"))  # EM per row with its 95% interval
"""

from __future__ import annotations

import json
from pathlib import Path

from r3rag.artifacts import load_manifest
from r3rag.errors import UserError

TRAINED = ("base", "sft", "rl")  # stages whose wall time is a policy's training time


def build_rows(spec: dict[str, str], built: dict[str, dict], path: Path) -> list[dict]:
    """One row per table entry: `<variant>/<system>` looked up in that variant's eval metrics."""
    rows, cache = [], {}
    for label, source in spec.items():
        variant, _, system = str(source).partition("/")
        refs = built[variant]
        if variant not in cache:
            cache[variant] = json.loads((refs["eval"].path / "metrics.json").read_text())["systems"]
        systems = cache[variant]
        if system not in systems:
            raise UserError(f"{path}: table.{label}: variant {variant!r} evaluated no system {system!r} "
                            f"(it has: {', '.join(systems)})")
        rows.append(_row(str(label), str(source), systems[system], _train_seconds(system, refs)))
    return rows


def _train_seconds(system: str, refs: dict) -> float:
    """The policy's own training: base + sft (+ rl for the RL policy), as recorded when built,
    plus a model another variant trained that a stage starts from through a path
    (`rl.model=${lora.base}/model`)."""
    used = [refs[s].manifest for s in (TRAINED if system.split("@")[0] == "rl" else ("base", "sft")) if s in refs]
    trained = {m.get("id"): m for m in used}  # by id: a model reached both ways counts once
    for m in filter(None, map(_model_artifact, used)):
        trained.setdefault(m.get("id"), m)
    return round(sum(m.get("seconds", 0.0) for m in trained.values()), 1)


def _model_artifact(manifest: dict) -> dict | None:
    """The manifest of the trained artifact holding a stage's `model` path, if it is one."""
    model = (manifest.get("config") or {}).get("model")
    if not isinstance(model, str) or not model:
        return None
    for folder in (Path(model), Path(model).parent):
        found = load_manifest(folder)
        if found and found["stage"] in TRAINED:
            return found
    return None


def _row(label: str, source: str, m: dict, train_seconds: float) -> dict:
    return {"label": label, "source": source, "em": m["em"], "em_ci": m.get("em_ci"), "f1": m["f1"],
            "n": m["n"], "searches": m.get("searches"),
            "by_hops": {str(h): v["em"] for h, v in sorted(m.get("by_hops", {}).items())},
            "train_seconds": train_seconds, "eval_seconds": m.get("seconds")}


def markdown(rows: list[dict], about: dict) -> str:
    hops = sorted({h for r in rows for h in r["by_hops"]}, key=int)
    head = ["", "EM [95% CI]", "F1", *(f"{h}-hop EM" for h in hops), "searches", "train min"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ci = f" [{r['em_ci'][0]:.3f}, {r['em_ci'][1]:.3f}]" if r["em_ci"] else ""
        cells = [r["label"], f"{r['em']:.3f}{ci}", f"{r['f1']:.3f}",
                 *(f"{r['by_hops'][h]:.3f}" if h in r["by_hops"] else "-" for h in hops),
                 "-" if r["searches"] is None else f"{r['searches']:.2f}", f"{r['train_seconds'] / 60:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    n = sorted({r["n"] for r in rows})
    lines += ["", f"{'/'.join(map(str, n))} held-out questions per row; 95% bootstrap intervals. "
              f"{about['date']}, {about['machine']}. Wall time {about['wall_seconds'] / 60:.1f} min "
              f"(artifacts' build time {about['compute_seconds'] / 60:.1f} min; reused artifacts count "
              "the time they took when first built)."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """EM per row (the table's order, top to bottom) with its 95% interval, one horizontal bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = range(len(rows))[::-1]  # the first row at the top
    ems = [r["em"] for r in rows]
    cis = [r["em_ci"] or (r["em"], r["em"]) for r in rows]
    err = [[em - lo for em, (lo, _) in zip(ems, cis)], [hi - em for em, (_, hi) in zip(ems, cis)]]
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(rows) + 1.0))
    ax.barh(list(ys), ems, xerr=err, color="#3b6fb6", capsize=3, height=0.6)
    for y, em, (_, hi) in zip(ys, ems, cis):  # the value right of its interval
        ax.text(min(hi, 0.93) + 0.015, y, f"{em:.3f}", va="center", fontsize=7)
    ax.set_yticks(list(ys), [r["label"] for r in rows], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("held-out EM (95% bootstrap interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
