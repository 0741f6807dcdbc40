"""EM and F1 equal the official HotpotQA evaluation logic (hotpot_evaluate_v1.py),
re-implemented here from its published definition, on tricky cases and on real answers."""

import random
import re
import string
from collections import Counter

import pytest

from r3rag.core.metrics import exact_match, f1, f1_score


# --- the official definition (SQuAD normalisation; yes/no/noanswer only match themselves) ---
def official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_f1(prediction, ground_truth):
    np_, ng = official_normalize(prediction), official_normalize(ground_truth)
    if np_ in ["yes", "no", "noanswer"] and np_ != ng:
        return 0.0
    if ng in ["yes", "no", "noanswer"] and np_ != ng:
        return 0.0
    pt, gt = np_.split(), ng.split()
    common = Counter(pt) & Counter(gt)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / len(pt), num_same / len(gt)
    return 2 * precision * recall / (precision + recall)


def official_em(prediction, ground_truth):
    return float(official_normalize(prediction) == official_normalize(ground_truth))


TRICKY = [
    ("The Beatles", "Beatles"),
    ("the  beatles!!", "Beatles"),
    ("An apple", "apple"),
    ("a", "a"),
    ("yes", "yes"),
    ("yes", "no"),
    ("no", "no answer"),
    ("noanswer", "no answer"),
    ("Yes.", "yes"),
    ("", "Paris"),
    ("Paris", ""),
    ("3,677 seated", "3677 seated"),
    ("U.S.", "US"),
    ("the the the", "the"),
    ("Théâtre", "theatre"),
    ("New York City", "New York"),
    ("York New", "New York"),
    ("1,000", "1000"),
    ("Panther's", "Panthers"),
    ("  spaces   around ", "spaces around"),
    ("A-ha", "aha"),
    ("an", "a"),
]


@pytest.mark.parametrize("prediction,gold", TRICKY)
def test_tricky_cases_match_official(prediction, gold):
    assert exact_match(prediction, [gold]) == official_em(prediction, gold)
    assert f1_score(prediction, [gold]) == pytest.approx(official_f1(prediction, gold))
    assert f1(prediction, [gold]) == f1_score(prediction, [gold])


def test_max_over_gold_answers():
    golds = ["New York City", "NYC"]
    assert f1("nyc", golds) == max(official_f1("nyc", g) for g in golds) == 1.0
    assert exact_match("new york city", golds) == 1.0


def _real_pairs(rows, n_min=200):
    rng = random.Random(0)
    pairs = []
    for r in rows:
        gold = r["golden_answers"][0]
        other = rng.choice(rows)["golden_answers"][0]
        pairs += [(gold, gold), (other, gold), (gold.upper() + ".", gold), (f"the {gold} ,", gold)]
        # a window of real supporting text around the answer, as a long-winded prediction
        for p in r["metadata"].get("paragraphs", []):
            i = p["text"].find(gold)
            if p.get("is_supporting") and i >= 0:
                pairs.append((p["text"][max(0, i - 30) : i + len(gold) + 30], gold))
                break
    assert len(pairs) >= n_min
    return pairs


def test_real_pairs_match_official(hotpotqa_pool):
    pairs = _real_pairs(hotpotqa_pool[1])
    for prediction, gold in pairs:
        assert exact_match(prediction, [gold]) == official_em(prediction, gold), (prediction, gold)
        assert f1(prediction, [gold]) == pytest.approx(official_f1(prediction, gold)), (prediction, gold)
    # the set is not degenerate: it has exact, partial and zero matches
    scores = [official_f1(p, g) for p, g in pairs]
    assert min(scores) == 0.0 and max(scores) == 1.0 and any(0 < s < 1 for s in scores)
