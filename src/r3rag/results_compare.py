"""Paired comparisons between an experiment's table rows: arm a minus arm b over the same questions.

An experiment (r3rag.experiment) may list the comparisons its claims rest on:

    compare:                       # each: [row a, row b], labels of `table`
      - [SFT + GRPO, SFT cold start]
      - [SFT + GRPO, "Control: more SFT"]

Each arm's per-question EM is first averaged over its seeds, then the difference is bootstrapped
over questions (r3rag.metrics.paired_over_seeds, the one paired helper): the mean difference, its
95% interval, and whether the interval holds 0 (the difference is inside the noise). Both arms
must have scored the same questions (the same split and limit).

Usage:
    pairs = compare_spec(path, data)                          # checked before anything runs
    comparisons = build_comparisons(pairs, data["table"], built)
    print(comparison_markdown(comparisons))
"""

from __future__ import annotations

from pathlib import Path

from r3rag.errors import UserError


def compare_spec(path: Path, data: dict) -> list[tuple[str, str]]:
    """The `compare` pairs, each naming two rows of `table`; [] without a `compare` section."""
    raw = data.get("compare") or []
    labels = set(map(str, (data.get("table") or {}).keys()))
    if not isinstance(raw, list):
        raise UserError(f"{path}: compare: expected a list of [row a, row b] pairs")
    pairs = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            raise UserError(f"{path}: compare[{i}]: expected [row a, row b], got {pair!r}")
        for label in map(str, pair):
            if label not in labels:
                raise UserError(f"{path}: compare[{i}]: {label!r} is not a row of table")
        pairs.append((str(pair[0]), str(pair[1])))
    return pairs


def build_comparisons(pairs: list[tuple[str, str]], table: dict, built: dict) -> list[dict]:
    """One dict per pair: a, b, diff (EM of a minus b), ci, n questions, n_seeds, inside_noise."""
    from r3rag.metrics import paired_over_seeds

    out = []
    for a, b in pairs:
        try:
            result = paired_over_seeds(_per_question(table[a], built), _per_question(table[b], built))
        except ValueError as e:  # different questions: different splits or limits
            raise UserError(f"compare [{a}, {b}]: {e}") from None
        out.append({"a": a, "b": b, **result, "ci": list(result["ci"]), "n_seeds": list(result["n_seeds"])})
    return out


def _per_question(source, built: dict) -> list[dict[str, float]]:
    """Per seed (source): {question id: EM} of that `<variant>/<system>`'s eval."""
    from r3rag.results_table import question_em

    out = []
    for one in source if isinstance(source, list) else [source]:
        variant, _, system = str(one).partition("/")
        out.append(question_em(built[variant]["eval"].path, system))
    return out


def comparison_markdown(comparisons: list[dict]) -> str:
    if not comparisons:
        return ""
    lines = ["| a | b | EM a - b [95% CI] | questions | seeds | inside the noise |", "|---|---|---|---|---|---|"]
    for c in comparisons:
        seeds = "/".join(map(str, c["n_seeds"]))
        noise = "yes" if c["inside_noise"] else "no"
        cells = [c["a"], c["b"], f"{c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]", str(c["n"]), seeds, noise]
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        "Paired over the same questions: each arm's per-question EM averaged over its seeds, the "
        "difference bootstrapped over questions (95% percentile interval); 'inside the noise' when it holds 0."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"
