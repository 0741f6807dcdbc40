"""The tables an eval writes beside metrics.json: scores per data set, and paired comparisons.

`dataset_table` is one markdown table, a row per system and data set (and "all"): EM, F1 and
cover with their 95% intervals over questions (r3rag.core.metrics.mean_ci: exact Clopper-Pearson for
0/1 scores, bootstrap otherwise). `paired_comparisons` compares every system with each
reference system (e.g. the SFT and SFT + GRPO policies) over the same questions: the mean EM
difference and its paired-bootstrap 95% interval; a difference whose interval holds 0 is inside
the noise, and the table says so.

Usage:
    md = dataset_table(metrics["systems"])
    comps = paired_comparisons(prediction_rows, references=["sft", "rl"])
    md += comparison_table(comps)
"""

from __future__ import annotations

from collections import defaultdict

from r3rag.core.metrics import paired_bootstrap_diff


def _cell(value, ci) -> str:
    return "-" if value is None else f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def dataset_table(systems: dict[str, dict]) -> str:
    lines = ["| system | data set | n | EM [95% CI] | F1 [95% CI] | cover [95% CI] |", "|---|---|---|---|---|---|"]
    for label, m in systems.items():
        rows = (
            [("all", m)] + sorted(m.get("by_dataset", {}).items())
            if len(m.get("by_dataset", {})) > 1
            else [(next(iter(m.get("by_dataset", {})), "all"), m)]
        )
        for name, d in rows:
            lines.append(
                f"| {label} | {name} | {d['n']} | {_cell(d['em'], d.get('em_ci', (0, 0)))} | "
                f"{_cell(d['f1'], d.get('f1_ci', (0, 0)))} | {_cell(d.get('cover'), d.get('cover_ci', (0, 0)))} |"
            )
    return "\n".join(lines) + "\n"


def em_by_question(rows: list[dict]) -> dict[str, dict[str, float]]:
    """system -> question id -> EM averaged over samples."""
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        acc[r["system"]][r["id"]].append(float(r["em"]))
    return {s: {q: sum(v) / len(v) for q, v in qs.items()} for s, qs in acc.items()}


def paired_comparisons(rows: list[dict], references: list[str]) -> list[dict]:
    """Each system against each reference, EM over the questions both answered."""
    em = em_by_question(rows)
    out = []
    for ref in [r for r in references if r in em]:
        for system in [s for s in em if s != ref]:
            ids = sorted(set(em[system]) & set(em[ref]))
            diff, ci = paired_bootstrap_diff([em[system][i] for i in ids], [em[ref][i] for i in ids])
            out.append(
                {
                    "system": system,
                    "reference": ref,
                    "n": len(ids),
                    "em_diff": diff,
                    "em_diff_ci": list(ci),
                    "inside_noise": ci[0] <= 0 <= ci[1],
                }
            )
    return out


def comparison_table(comparisons: list[dict]) -> str:
    if not comparisons:
        return ""
    lines = ["| system | vs | n | EM difference [95% paired CI] | verdict |", "|---|---|---|---|---|"]
    for c in comparisons:
        verdict = "inside the noise" if c["inside_noise"] else ("better" if c["em_diff"] > 0 else "worse")
        lines.append(
            f"| {c['system']} | {c['reference']} | {c['n']} | "
            f"{c['em_diff']:+.3f} [{c['em_diff_ci'][0]:+.3f}, {c['em_diff_ci'][1]:+.3f}] | {verdict} |"
        )
    return "\n".join(lines) + "\n"
