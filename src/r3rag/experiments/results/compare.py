"""Paired comparisons between an experiment's table rows: arm a minus arm b over the same questions.

An experiment (r3rag.experiments.experiment) may list the comparisons its claims rest on, each
[row a, row b] (labels of `table`) or, to state the claim in words, a mapping:

    compare:
      - [SFT + GRPO, SFT cold start]                           # the claim: "SFT + GRPO beats SFT cold start"
      - {a: SFT + GRPO, b: "Control: more SFT", claim: GRPO beats the matched control}

Each arm's per-question EM is first averaged over its seeds, then the difference is bootstrapped
over questions (r3rag.core.metrics.paired_over_seeds, the one paired helper): the mean difference, its
95% interval, and whether the interval holds 0 (the difference is inside the noise). Both arms
must have scored the same questions (the same split and limit). Where both arms are seeded
(`<variant>#s<N>`), `per_seed` also holds the difference at each seed, so a reader sees whether
a gain appears in every seed or only on average. Every comparison is a claim that a beats b:
it stands only where the interval lies above 0 (`verdict`); inside the noise or reversed, it does
not stand, and the tables say which.

Usage:
    pairs = compare_spec(path, data)                          # checked before anything runs
    comparisons = build_comparisons(pairs, data["table"], built, claims=compare_claims(path, data))
    print(comparison_markdown(comparisons))                   # the table
    print(claims_markdown(comparisons))                       # each claim in a sentence: stands or not
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from r3rag.util.errors import UserError


def compare_spec(path: Path, data: dict) -> list[tuple[str, str]]:
    """The `compare` pairs, each naming two rows of `table`; [] without a `compare` section."""
    return [(e["a"], e["b"]) for e in compare_entries(path, data)]


def compare_claims(path: Path, data: dict) -> dict[tuple[str, str], str]:
    """{(a, b): the claim in words} for the entries that state one."""
    return {(e["a"], e["b"]): e["claim"] for e in compare_entries(path, data) if e["claim"]}


def compare_entries(path: Path, data: dict) -> list[dict]:
    """The `compare` section checked: [{"a", "b", "claim" (None where not stated)}]."""
    raw = data.get("compare") or []
    labels = set(map(str, (data.get("table") or {}).keys()))
    if not isinstance(raw, list):
        raise UserError(f"{path}: compare: expected a list of [row a, row b] pairs")
    entries = []
    for i, entry in enumerate(raw):
        rows = entry_rows(entry)
        extra = sorted(set(entry) - {"a", "b", "claim"}) if isinstance(entry, dict) else []
        if rows is None or extra:
            raise UserError(
                f"{path}: compare[{i}]: expected [row a, row b] or {{a: ..., b: ..., claim: ...}}, got {entry!r}"
            )
        for label in rows:
            if label not in labels:
                raise UserError(f"{path}: compare[{i}]: {label!r} is not a row of table")
        claim = entry.get("claim") if isinstance(entry, dict) else None
        entries.append({"a": rows[0], "b": rows[1], "claim": str(claim).strip() if claim else None})
    return entries


def entry_rows(entry) -> tuple[str, str] | None:
    """The two row labels of one `compare` entry, in either form; None when it is neither."""
    if isinstance(entry, list) and len(entry) == 2:
        return str(entry[0]), str(entry[1])
    if isinstance(entry, dict) and entry.get("a") is not None and entry.get("b") is not None:
        return str(entry["a"]), str(entry["b"])
    return None


def build_comparisons(
    pairs: list[tuple[str, str]],
    table: dict,
    built: dict | None,
    em_of: Callable[[str], dict] | None = None,
    claims: dict[tuple[str, str], str] | None = None,
) -> list[dict]:
    """One dict per pair: a, b, claim (its words, else "a beats b"), diff (EM of a minus b), ci,
    n questions, n_seeds, inside_noise, per_seed. Per-question EM from the eval artifacts in
    `built`, or from `em_of(<variant>/<system>)` (the committed slice files' outcomes,
    r3rag.experiments.slices.merge)."""
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
                "claim": (claims or {}).get((a, b)) or f"{a} beats {b}",
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
    from r3rag.experiments.results.table import row_sources

    sources = row_sources(source)
    seeds = {s.partition("/")[0].rpartition("#")[2]: s for s in sources if "#s" in s.partition("/")[0]}
    return seeds if len(seeds) == len(sources) else {}


def _per_question(source, em_of: Callable[[str], dict]) -> list[dict[str, float]]:
    """Per seed (source): {question id: EM} of that `<variant>/<system>`."""
    from r3rag.experiments.results.table import row_sources

    return [em_of(one) for one in row_sources(source)]


def _artifact_em(source: str, built: dict) -> dict[str, float]:
    """{question id: EM} of one `<variant>/<system>` from its variant's eval artifact."""
    from r3rag.experiments.results.table import question_em

    variant, _, system = str(source).partition("/")
    return question_em(built[variant]["eval"].path, system)


def verdict(c: dict) -> str:
    """Whether the claim "a beats b" stands: only where the paired interval lies above 0, and said
    where a seed disagrees with the mean; else why not (inside the noise, or b is better)."""
    low, high = c["ci"]
    if low > 0:
        per_seed = (c.get("per_seed") or {}).values()
        return "stands, not at every seed" if any(d <= 0 for d in per_seed) else "stands"
    return "does not stand: b is better" if high < 0 else "does not stand: inside the noise"


def comparison_markdown(comparisons: list[dict]) -> str:
    if not comparisons:
        return ""
    by_seed = any(len(c.get("per_seed") or {}) > 1 for c in comparisons)  # the column only where seeds pair
    head = ["a", "b", "EM a - b [95% CI]", "questions", "seeds", "a beats b?", *(["a - b per seed"] * by_seed)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in comparisons:
        seeds = "/".join(map(str, c["n_seeds"]))
        cells = [c["a"], c["b"], _difference(c), str(c["n"]), seeds, verdict(c)]
        lines.append("| " + " | ".join(cells + [_per_seed(c) or "-"] * by_seed) + " |")
    note = (
        "Paired over the same questions: each arm's per-question EM averaged over its seeds, the "
        "difference bootstrapped over questions (95% percentile interval); a claim that a beats b "
        "stands only where the interval lies above 0."
    )
    if by_seed:
        note += " Per seed: the difference at each seed both arms ran (seed N's arms start from seed N's cold start)."
    return "\n".join(lines) + "\n\n" + note + "\n"


def claims_markdown(comparisons: list[dict]) -> str:
    """Each claim in a sentence: stands or not, with its paired difference, interval and seeds."""
    lines = []
    for c in comparisons:
        claim = c.get("claim") or f"{c['a']} beats {c['b']}"  # results files written before claims had words
        seeds = " and ".join(dict.fromkeys(map(str, c["n_seeds"])))
        per_seed = _per_seed(c) if len(c.get("per_seed") or {}) > 1 else ""
        lines.append(  # the rows' labels are in the claim's words or in the comparisons table
            f"- **{claim}**: {verdict(c).replace('b is better', 'the other arm is better')}; "
            f"EM {_difference(c)} over {c['n']} questions, {seeds} seed{'s' * (seeds != '1')}"
            + (f" (per seed {per_seed})" if per_seed else "")
            + "."
        )
    return "\n".join(lines) + "\n" if lines else ""


def _difference(c: dict) -> str:
    return f"{c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]"


def _per_seed(c: dict) -> str:
    return " / ".join(f"{d:+.3f}" for d in (c.get("per_seed") or {}).values())
