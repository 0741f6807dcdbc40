"""Answer metrics with the standard (SQuAD/HotpotQA/FlashRAG) normalisation.

Usage:
    exact_match("The Velmar", ["velmar"]) -> 1.0
    f1("in Velmar city", ["Velmar"]) -> 0.5
    bootstrap_ci([1, 0, 1, 1]) -> (low, high) of the mean, 95%
    mean_ci([0] * 400) -> (0.0, 0.0092): exact (Clopper-Pearson) for 0/1 scores, else bootstrap
    over_seeds([{"q1": 1, "q2": 0}, {"q1": 1, "q2": 1}]) -> mean, sd over seeds, n_seeds, ci over questions
"""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCT = set(string.punctuation)
_SPECIAL = {"yes", "no", "noanswer"}


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, golds: list[str]) -> float:
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def cover_match(prediction: str | None, golds: list[str]) -> float:
    """A normalised gold answer occurs inside the normalised prediction."""
    if prediction is None:
        return 0.0
    p = f" {normalize_answer(prediction)} "
    return float(any(f" {normalize_answer(g)} " in p for g in golds if normalize_answer(g)))


def _f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    # HotpotQA: yes/no/noanswer only match themselves.
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0
    pt, gt = p.split(), g.split()
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pt), same / len(gt)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: list[str]) -> float:
    """Token F1, the max over the gold answers."""
    if prediction is None:
        return 0.0
    return max((_f1(prediction, g) for g in golds), default=0.0)


f1 = f1_score  # the short name: r3rag.core.metrics.f1(prediction, golden_answers)


def _percentile_bootstrap(values, n_resamples: int, alpha: float, seed: int) -> tuple[float, float]:
    """The one resampler behind every interval over questions: percentile bootstrap of the mean,
    seeded numpy, so a table is the same on every rerun. Resamples in chunks so that thousands of
    questions x thousands of resamples never sit in memory at once."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // len(x))
    means = np.concatenate(
        [
            x[rng.integers(0, len(x), size=(min(chunk, n_resamples - i), len(x)))].mean(axis=1)
            for i in range(0, n_resamples, chunk)
        ]
    )
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def bootstrap_ci(
    values: list[float], n_resamples: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean (default 95%)."""
    if not len(values):
        return (0.0, 0.0)
    lo, hi = _percentile_bootstrap(values, n_resamples, alpha, seed)
    return (round(lo, 4), round(hi, 4))


def clopper_pearson(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact binomial interval of a proportion (default 95%). Unlike a bootstrap it does not
    collapse to [0, 0] at 0/n: 0/400 gives [0, 1 - 0.025 ** (1/400)] = [0, 0.0092]."""
    from scipy.stats import beta

    if n == 0:
        return (0.0, 0.0)
    lo = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, n - successes + 1))
    hi = 1.0 if successes == n else float(beta.ppf(1 - alpha / 2, successes + 1, n - successes))
    return (round(lo, 4), round(hi, 4))


def mean_ci(values: list[float], alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """The interval of a mean over questions: exact Clopper-Pearson when every score is 0 or 1
    (EM or cover with one sample per question: a proportion), else the percentile bootstrap
    (F1, scores averaged over samples or seeds)."""
    if all(v in (0, 1) for v in values):
        return clopper_pearson(int(sum(values)), len(values), alpha)
    return bootstrap_ci(values, alpha=alpha, seed=seed)


def paired_bootstrap_diff(
    a: list[float], b: list[float], n_resamples: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, tuple[float, float]]:
    """Mean of a - b over the same questions, and its percentile bootstrap interval (default 95%):
    resampling the per-question differences resamples both arms with the same question indices,
    so per-question difficulty cancels."""
    if len(a) != len(b):
        raise ValueError(f"paired bootstrap: {len(a)} vs {len(b)} values (the arms must share questions)")
    if not a:
        return 0.0, (0.0, 0.0)
    diff = [x - y for x, y in zip(a, b)]
    return round(sum(diff) / len(diff), 4), bootstrap_ci(diff, n_resamples, alpha, seed)


def _seed_average(runs: list[dict[str, float]]) -> dict[str, float]:
    """question id -> its score averaged over seeds; every seed must have scored the same questions."""
    if not runs:
        raise ValueError("over seeds: no runs")
    ids = set(runs[0])
    for i, run in enumerate(runs[1:], 1):
        if set(run) != ids:
            raise ValueError(
                f"over seeds: seed {i} scored {len(run)} questions, seed 0 {len(ids)} "
                f"({len(set(run) ^ ids)} differ; the seeds must share questions)"
            )
    return {q: sum(run[q] for run in runs) / len(runs) for q in sorted(ids)}


def over_seeds(runs: list[dict[str, float]], alpha: float = 0.05) -> dict:
    """One arm run with several seeds (per seed: question id -> score): the mean and sd (ddof=1) of
    the per-seed means, which is the seed-to-seed noise, and the interval over questions of the
    seed-averaged scores, which is the question-sampling noise. sd is None with one seed."""
    import numpy as np

    per_seed = np.array([sum(run.values()) / len(run) if run else 0.0 for run in runs])
    per_q = list(_seed_average(runs).values())
    return {
        "mean": round(float(per_seed.mean()), 4),
        "sd": round(float(per_seed.std(ddof=1)), 4) if len(runs) > 1 else None,
        "n_seeds": len(runs),
        "n": len(per_q),
        "ci": mean_ci(per_q, alpha),
        "per_seed": [round(float(m), 4) for m in per_seed],
    }


def paired_over_seeds(a: list[dict[str, float]], b: list[dict[str, float]], alpha: float = 0.05) -> dict:
    """Arm a minus arm b over the same questions: each arm averaged over its seeds per question
    first, then the paired bootstrap of the per-question differences."""
    qa, qb = _seed_average(a), _seed_average(b)
    if set(qa) != set(qb):
        raise ValueError(f"paired over seeds: the arms scored different questions ({len(set(qa) ^ set(qb))} differ)")
    diff, ci = paired_bootstrap_diff([qa[q] for q in qa], [qb[q] for q in qa], alpha=alpha)
    return {"diff": diff, "ci": ci, "n": len(qa), "n_seeds": (len(a), len(b)), "inside_noise": ci[0] <= 0 <= ci[1]}
