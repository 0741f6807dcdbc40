"""Answer metrics with the standard (SQuAD/HotpotQA/FlashRAG) normalisation.

Usage:
    exact_match("The Velmar", ["velmar"]) -> 1.0
    f1_score("in Velmar city", ["Velmar"]) -> 0.5
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
    if prediction is None:
        return 0.0
    return max((_f1(prediction, g) for g in golds), default=0.0)
