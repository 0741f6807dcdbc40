"""Paired comparisons between an experiment's table rows: arm a minus arm b over the same questions.

An experiment (r3rag.experiments.experiment) may list the comparisons its claims rest on:

    compare:                       # each: [row a, row b], labels of `table`
      - [SFT + GRPO, SFT cold start]
      - [SFT + GRPO, "Control: more SFT"]

Each arm's per-question EM is first averaged over its seeds, then the difference is bootstrapped
over questions (r3rag.core.metrics.paired_over_seeds, the one paired helper): the mean difference, its
95% interval, and whether the interval holds 0 (the difference is inside the noise). Both arms
must have scored the same questions (the same split and limit). Where both arms are seeded
(`<variant>#s<N>`), `per_seed` also holds the difference at each seed, so a reader sees whether
a gain appears in every seed or only on average.

Usage:
    pairs = compare_spec(path, data)                          # checked before anything runs
    comparisons = build_comparisons(pairs, data["table"], built)
    print(comparison_markdown(comparisons))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from r3rag.util.errors import UserError


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


def build_comparisons(
    pairs: list[tuple[str, str]], table: dict, built: dict | None, em_of: Callable[[str], dict] | None = None
) -> list[dict]:
    """One dict per pair: a, b, diff (EM of a minus b), ci, n questions, n_seeds, inside_noise.
    Per-question EM from the eval artifacts in `built`, or from `em_of(<variant>/<system>)` (the
    committed slice files' outcomes, r3rag.experiments.slice_merge)."""
    from r3rag.core.metrics import paired_over_seeds

    em_of = em_of or (lambda source: _artifact_em(source, built))
    out = []
    for a, b in pairs:
        try:
            result = paired_over_seeds(_per_question(table[a], em_of), _per_question(table[b], em_of))
        except ValueError as e:  # different questions: different splits or limits
            raise UserError(f"compare [{a}, {b}]: {e}") from None
        per_seed = seed_differences(table[a], table[b], built, em_of)
        out.append(
            {
                "a": a,
                "b": b,
                **result,
                "ci": list(result["ci"]),
                "n_seeds": list(result["n_seeds"]),
                "per_seed": per_seed,
            }
        )
    return out


def seed_differences(a, b, built: dict | None, em_of: Callable[[str], dict] | None = None) -> dict[str, float] | None:
    """{seed: EM of a minus b at that seed} for the seeds both arms ran (`<variant>#s<N>` sources:
    GRPO's seed N starts from the cold start's seed N, so they pair); None unless both are seeded."""
    em_of = em_of or (lambda source: _artifact_em(source, built))
    seeds_a, seeds_b = _by_seed(a), _by_seed(b)
    if not seeds_a or not seeds_b:
        return None
    out = {}
    for seed in [s for s in seeds_a if s in seeds_b]:
        (qa,), (qb,) = _per_question(seeds_a[seed], em_of), _per_question(seeds_b[seed], em_of)
        out[seed] = round(sum(qa.values()) / len(qa) - sum(qb.values()) / len(qb), 4)
    return out


def _by_seed(source) -> dict[str, str]:
    """{"s0": "main#s0/rl", ...}; {} when a source is not one of a seeded variant's."""
    from r3rag.experiments.results_table import row_sources

    sources = row_sources(source)
    seeds = {s.partition("/")[0].rpartition("#")[2]: s for s in sources if "#s" in s.partition("/")[0]}
    return seeds if len(seeds) == len(sources) else {}


def _per_question(source, em_of: Callable[[str], dict]) -> list[dict[str, float]]:
    """Per seed (source): {question id: EM} of that `<variant>/<system>`."""
    from r3rag.experiments.results_table import row_sources

    return [em_of(one) for one in row_sources(source)]


def _artifact_em(source: str, built: dict) -> dict[str, float]:
    """{question id: EM} of one `<variant>/<system>` from its variant's eval artifact."""
    from r3rag.experiments.results_table import question_em

    variant, _, system = str(source).partition("/")
    return question_em(built[variant]["eval"].path, system)


def comparison_markdown(comparisons: list[dict]) -> str:
    if not comparisons:
        return ""
    by_seed = any(len(c.get("per_seed") or {}) > 1 for c in comparisons)  # the column only where seeds pair
    head = ["a", "b", "EM a - b [95% CI]", "questions", "seeds", "inside the noise", *(["a - b per seed"] * by_seed)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in comparisons:
        seeds = "/".join(map(str, c["n_seeds"]))
        noise = "yes" if c["inside_noise"] else "no"
        cells = [c["a"], c["b"], f"{c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]", str(c["n"]), seeds, noise]
        per_seed = " / ".join(f"{d:+.3f}" for d in (c.get("per_seed") or {}).values()) or "-"
        lines.append("| " + " | ".join(cells + [per_seed] * by_seed) + " |")
    note = (
        "Paired over the same questions: each arm's per-question EM averaged over its seeds, the "
        "difference bootstrapped over questions (95% percentile interval); 'inside the noise' when it holds 0."
    )
    if by_seed:
        note += " Per seed: the difference at each seed both arms ran (seed N's arms start from seed N's cold start)."
    return "\n".join(lines) + "\n\n" + note + "\n"
