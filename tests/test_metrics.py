"""Answer metrics with the standard normalisation."""

import pytest

from r3rag.core.metrics import cover_match, exact_match, f1_score, normalize_answer


def test_normalisation():
    assert normalize_answer("  The  Velmar, Inc.! ") == "velmar inc"
    assert normalize_answer("An apple a day") == "apple day"


def test_exact_match_any_gold():
    assert exact_match("the Velmar", ["Korla", "velmar"]) == 1.0
    assert exact_match("Velmar city", ["Velmar"]) == 0.0
    assert exact_match(None, ["Velmar"]) == 0.0


def test_f1_partial_overlap_and_special_answers():
    assert f1_score("Velmar city", ["Velmar"]) == pytest.approx(2 / 3)
    assert f1_score("no", ["yes"]) == 0.0
    assert f1_score("yes", ["yes"]) == 1.0
    assert f1_score("no it is", ["no"]) == 0.0  # yes/no only match themselves exactly
    assert f1_score("Korla", ["Velmar"]) == 0.0


def test_cover_match_is_token_bounded():
    assert cover_match("It is in Velmar city.", ["Velmar"]) == 1.0
    assert cover_match("Velmarsson", ["Velmar"]) == 0.0


def test_bootstrap_ci_brackets_the_mean_and_narrows_with_n():
    from r3rag.core.metrics import bootstrap_ci

    small = [1.0, 0.0] * 10
    big = [1.0, 0.0] * 500
    lo, hi = bootstrap_ci(small)
    assert lo < 0.5 < hi
    blo, bhi = bootstrap_ci(big)
    assert blo < 0.5 < bhi and (bhi - blo) < (hi - lo)
    assert bootstrap_ci([1.0] * 30) == (1.0, 1.0)
