"""Answer metrics with the standard (SQuAD/HotpotQA/FlashRAG) normalisation.

Usage:
    exact_match("The Velmar", ["velmar"]) -> 1.0
    f1("in Velmar city", ["Velmar"]) -> 0.5
    bootstrap_ci([1, 0, 1, 1]) -> (low, high) of the mean, 95%
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


f1 = f1_score  # the short name: r3rag.metrics.f1(prediction, golden_answers)


def bootstrap_ci(values: list[float], n_resamples: int = 1000, alpha: float = 0.05, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean (default 95%)."""
    import random

    if not values:
        return (0.0, 0.0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_resamples))
    lo = means[int((alpha / 2) * n_resamples)]
    hi = means[min(n_resamples - 1, int((1 - alpha / 2) * n_resamples))]
    return (round(lo, 4), round(hi, 4))


def paired_bootstrap_diff(a: list[float], b: list[float], n_resamples: int = 2000, alpha: float = 0.05,
                          seed: int = 0) -> tuple[float, tuple[float, float]]:
    """Mean of a - b over the same questions, and its percentile bootstrap interval (default 95%):
    both arms resampled with the same question indices, so per-question difficulty cancels."""
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired bootstrap: {len(a)} vs {len(b)} values (the arms must share questions)")
    if not a:
        return 0.0, (0.0, 0.0)
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(n_resamples, len(diff)))
    means = np.sort(diff[idx].mean(axis=1))
    lo = means[int((alpha / 2) * n_resamples)]
    hi = means[min(n_resamples - 1, int((1 - alpha / 2) * n_resamples))]
    return round(float(diff.mean()), 4), (round(float(lo), 4), round(float(hi), 4))
