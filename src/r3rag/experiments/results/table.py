"""An experiment's results table (see r3rag.experiments.experiment): rows from eval artifacts, as Markdown.

A row's source may be a list, one `<variant>/<system>` per seed (variants that differ only in
`rl.seed`): the row is then the mean ± sd over seeds (ddof=1) of EM, with its 95% interval over
questions of the seed-averaged per-question EM (r3rag.core.metrics.over_seeds).

Usage:
    rows = build_rows({"SFT": "main/sft", "GRPO": ["main/rl", "s2/rl"]}, {"main": {...}, "s2": {...}}, path)
    print(markdown(rows, {"date": "...", "machine": "...", "wall_seconds": 1.0, "compute_seconds": 2.0}))
    plot(rows, Path("table.png"))  # EM per row with its 95% interval
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from r3rag.core.artifacts import built_seconds, load_manifest
from r3rag.core.metrics import over_seeds
from r3rag.evaluation.tables import em_by_question
from r3rag.util.errors import UserError
from r3rag.util.jsonl import read_jsonl

TRAINED = ("base", "sft", "rl")  # stages whose wall time is a policy's training time


class Outcome(NamedTuple):
    """What a table row needs of one `<variant>/<system>`: its eval metrics (metrics.json's entry for
    the system), its policy's training seconds, and its per-question EM (read only for rows over seeds)."""

    metrics: dict
    train_seconds: float
    question_em: Callable[[], dict[str, float]]


def row_sources(source) -> list[str]:
    """A table row's `<variant>/<system>` sources: one, or a list (one per seed)."""
    return [str(s) for s in source] if isinstance(source, list) else [str(source)]


def build_rows(spec: dict[str, str | list[str]], built: dict[str, dict], path: Path) -> list[dict]:
    """One row per table entry: `<variant>/<system>` looked up in that variant's eval metrics, or
    a list of them (one per seed) summarised over seeds."""
    cache: dict = {}
    return rows_from(spec, lambda label, source: _lookup(label, source, built, cache, path))


def rows_from(spec: dict[str, str | list[str]], lookup: Callable[[str, str], Outcome]) -> list[dict]:
    """build_rows over any store of outcomes: `lookup(label, source)` gives one `<variant>/<system>`'s
    Outcome (from eval artifacts here; from committed slice files in r3rag.experiments.slices.merge, so that a
    merged table is computed exactly as the experiment's own)."""
    rows = []
    for label, source in spec.items():
        sources = row_sources(source)
        found = [lookup(str(label), s) for s in sources]
        if len(found) == 1:
            rows.append(_row(str(label), sources[0], found[0].metrics, found[0].train_seconds))
        else:
            rows.append(_seed_row(str(label), sources, found))
    return rows


def _lookup(label: str, source: str, built: dict[str, dict], cache: dict, path: Path) -> Outcome:
    """One `<variant>/<system>`'s Outcome from its variant's eval artifact."""
    variant, _, system = source.partition("/")
    refs = built[variant]
    if variant not in cache:
        cache[variant] = json.loads((refs["eval"].path / "metrics.json").read_text())["systems"]
    systems = cache[variant]
    if system not in systems:
        raise UserError(
            f"{path}: table.{label}: variant {variant!r} evaluated no system {system!r} (it has: {', '.join(systems)})"
        )
    eval_dir = refs["eval"].path
    return Outcome(systems[system], train_seconds(system, refs), lambda: question_em(eval_dir, system))


def _seed_row(label: str, sources: list[str], found: list[Outcome]) -> dict:
    """A row over seeds: EM mean ± sd over seeds and its interval over questions (from each
    seed's per-question EM); the other columns averaged over seeds."""
    em = over_seeds([o.question_em() for o in found])
    ms = [o.metrics for o in found]
    mean = lambda xs: None if any(x is None for x in xs) else round(sum(xs) / len(xs), 4)  # noqa: E731
    hops = sorted({str(h) for m in ms for h in m.get("by_hops", {})})
    return {
        "label": label,
        "source": sources,
        "em": em["mean"],
        "em_sd": em["sd"],
        "n_seeds": em["n_seeds"],
        "em_per_seed": em["per_seed"],
        "em_ci": list(em["ci"]),
        "f1": mean([m["f1"] for m in ms]),
        "n": em["n"],
        "searches": mean([m.get("searches") for m in ms]),
        "by_hops": {
            h: v for h in hops if (v := mean([m.get("by_hops", {}).get(h, {}).get("em") for m in ms])) is not None
        },
        "train_seconds": mean([o.train_seconds for o in found]),
        "eval_seconds": mean([m.get("seconds") for m in ms]),
    }


def question_em(eval_dir: Path, system: str) -> dict[str, float]:
    """{question id: EM} of one system in an eval artifact (its predictions.jsonl)."""
    return em_by_question(read_jsonl(eval_dir / "predictions.jsonl"))[system]


def train_seconds(system: str, refs: dict) -> float:
    """The policy's own training: base + sft (+ rl for the RL policy), as recorded when built,
    plus a model another variant trained that a stage starts from through a path
    (`rl.model=${lora.base}/model`), plus teacher data sampled from a policy (`synthesize.teacher=hf`:
    rejection sampling's samples are part of its training, as GRPO's rollouts are of GRPO's)."""
    stages = TRAINED if system.split("@")[0] == "rl" else ("base", "sft")
    used = [(refs[s].manifest, getattr(refs[s], "path", None)) for s in stages if s in refs]
    if "synthesize" in refs and (refs["synthesize"].manifest.get("config") or {}).get("teacher") == "hf":
        used.append((refs["synthesize"].manifest, None))
    trained = {m.get("id"): (m, path) for m, path in used}  # by id: a model reached both ways counts once
    for found in filter(None, (_model_artifact(m) for m, _ in used)):
        trained.setdefault(found[0].get("id"), found)
    return round(sum((built_seconds(m) or 0.0) + _legacy_resume_seconds(m, path) for m, path in trained.values()), 1)


def _model_artifact(manifest: dict) -> tuple[dict, Path] | None:
    """The manifest and folder of the trained artifact holding a stage's `model` path, if it is one."""
    model = (manifest.get("config") or {}).get("model")
    if not isinstance(model, str) or not model:
        return None
    for folder in (Path(model), Path(model).parent):
        found = load_manifest(folder)
        if found and found["stage"] in TRAINED:
            return found, folder
    return None


def _legacy_resume_seconds(manifest: dict, path: Path) -> float:
    """An RL run resumed before r3rag recorded the time of the legs before a resume
    (`train_seconds_before_resume`) counted its last leg only: add the logged step times up to
    the step it resumed from (r3rag.training.observe.logged_seconds)."""
    metrics = manifest.get("metrics") or {}
    step = metrics.get("resumed_from_step") or 0
    if manifest.get("stage") != "rl" or not step or "train_seconds_before_resume" in metrics or path is None:
        return 0.0
    from r3rag.training.observe import logged_seconds

    return logged_seconds(Path(path) / "metrics.jsonl", step)


def _row(label: str, source: str, m: dict, train_seconds: float) -> dict:
    return {
        "label": label,
        "source": source,
        "em": m["em"],
        "em_ci": m.get("em_ci"),
        "f1": m["f1"],
        "n": m["n"],
        "searches": m.get("searches"),
        "by_hops": {str(h): v["em"] for h, v in sorted(m.get("by_hops", {}).items())},
        "train_seconds": train_seconds,
        "eval_seconds": m.get("seconds"),
    }


def _em_cell(r: dict) -> str:
    sd = f" ± {r['em_sd']:.3f}" if r.get("em_sd") is not None else ""
    ci = f" [{r['em_ci'][0]:.3f}, {r['em_ci'][1]:.3f}]" if r["em_ci"] else ""
    return f"{r['em']:.3f}{sd}{ci}"


MAX_HOP_COLUMNS = 8  # more search counts than this (long-horizon worlds: 1 to 40) are binned


def hop_bins(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """The hop columns of `rows`: (label, the search counts it covers). Up to MAX_HOP_COLUMNS
    counts, one column each; more, binned by powers of two (1, 2, 3-4, 5-8, 9-16, 17-32, ...)."""
    hops = sorted({int(h) for r in rows for h in r["by_hops"]})
    if len(hops) <= MAX_HOP_COLUMNS:
        return [(str(h), [str(h)]) for h in hops]
    bins: dict[int, list[str]] = {}
    for h in hops:
        bins.setdefault((h - 1).bit_length(), []).append(str(h))  # 1 | 2 | 3-4 | 5-8 | 9-16 | ...
    return [(hs[0] if len(hs) == 1 else f"{hs[0]}-{hs[-1]}", hs) for hs in bins.values()]


def binned_em(row: dict, hops: list[str]) -> float | None:
    """The mean EM of the search counts in `hops` that the row has (each count alike); None: none."""
    ems = [row["by_hops"][h] for h in hops if h in row["by_hops"]]
    return sum(ems) / len(ems) if ems else None


def markdown(rows: list[dict], about: dict | None) -> str:
    """The table, and a note on its statistics; `about` (date, machine, wall and build seconds)
    adds when and where it ran (None: rows from several runs, e.g. the results so far)."""
    bins = hop_bins(rows)
    seeded = any(r.get("n_seeds", 1) > 1 for r in rows)  # the seeds column only when a row has seeds
    head = ["", "EM [95% CI]", "F1", *(f"{label}-hop EM" for label, _ in bins), "searches", "train min"]
    head += ["EM per seed"] * seeded
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["label"],
            _em_cell(r),
            f"{r['f1']:.3f}",
            *("-" if (em := binned_em(r, hs)) is None else f"{em:.3f}" for _, hs in bins),
            "-" if r["searches"] is None else f"{r['searches']:.2f}",
            f"{r['train_seconds'] / 60:.1f}",
            *([" / ".join(f"{x:.3f}" for x in r.get("em_per_seed") or []) or "-"] * seeded),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    n = sorted({r["n"] for r in rows})
    seeds = (
        (
            " A row with several seeds: EM is the mean ± sd over seeds (ddof=1), its interval is over "
            "questions of the seed-averaged EM; the other columns are means over seeds."
        )
        if seeded
        else ""
    )
    when = (
        f" {about['date']}, {about['machine']}. Wall time {about['wall_seconds'] / 60:.1f} min "
        f"(artifacts' build time {about['compute_seconds'] / 60:.1f} min; reused artifacts count "
        "the time they took when first built)."
        if about
        else ""
    )
    binned = (
        " A hop column over several search counts is the mean of their EMs, each count alike."
        if any(len(hs) > 1 for _, hs in bins)
        else ""
    )
    lines += [
        "",
        f"{'/'.join(map(str, n))} held-out questions per row; 95% intervals over questions "
        "(exact Clopper-Pearson where every question's EM is 0 or 1, else percentile bootstrap)."
        f"{binned}{seeds}{when}",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """EM per row (the table's order, top to bottom) with its 95% interval, one horizontal bar each,
    and a dot per seed on a row over seeds."""
    from r3rag.util.extras import pyplot_or_skip

    plt = pyplot_or_skip(path.name)  # written after every run finished: without [plots], a note, not a failure
    if plt is None:
        return
    fig = chart(rows, plt)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # a long row label pushes the axis note past the figure
    plt.close(fig)


def chart(rows: list[dict], plt):
    """plot's figure."""
    ys = range(len(rows))[::-1]  # the first row at the top
    ems = [r["em"] for r in rows]
    cis = [r["em_ci"] or (r["em"], r["em"]) for r in rows]
    err = [[em - lo for em, (lo, _) in zip(ems, cis)], [hi - em for em, (_, hi) in zip(ems, cis)]]
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(rows) + 1.0))
    ax.barh(list(ys), ems, xerr=err, color="#3b6fb6", capsize=3, height=0.6)
    for y, r in zip(ys, rows):  # a row over seeds: each seed's EM as a dot, so the seed spread shows
        seeds = r.get("em_per_seed") or []
        ax.plot(seeds, [y - 0.17] * len(seeds), "o", color="#f0a030", mec="black", mew=0.5, ms=4, zorder=3)
    for y, em, (_, hi) in zip(ys, ems, cis):  # the value right of its interval (room kept past 1.0)
        ax.text(hi + 0.015, y, f"{em:.3f}", va="center", fontsize=7)
    ax.set_yticks(list(ys), [r["label"] for r in rows], fontsize=8)
    ax.set_xlim(0, 1.1)
    ax.set_xticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    seeded = any(r.get("em_per_seed") for r in rows)  # two lines: beside long row labels one would be cut
    ax.set_xlabel("held-out EM\n(95% interval over questions" + ("; dots: each seed's EM)" if seeded else ")"))
    fig.tight_layout()
    return fig


def plot_by_searches(rows: list[dict], path: Path) -> None:
    """EM against the number of searches a question needs (its hops), one line per row (a row over
    seeds: the mean over seeds), the search count on a log-2 axis."""
    from r3rag.util.extras import pyplot_or_skip

    plt = pyplot_or_skip(path.name)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        hops = sorted(r["by_hops"], key=int)
        ax.plot([int(h) for h in hops], [r["by_hops"][h] for h in hops], "o-", ms=3, label=r["label"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("searches the question needs")
    ax.set_ylabel("held-out EM")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
