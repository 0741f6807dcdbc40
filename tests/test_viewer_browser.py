"""The HTML viewer rendered by a real headless Chromium: questions grouped with every system side by
side, gold documents highlighted, filters by outcome and data set, opening on a disagreement."""

import json

import pytest

from r3rag.evaluation.browser import chromium_path, dump_dom, screenshot
from r3rag.evaluation.report import write_viewer

pytestmark = pytest.mark.skipif(
    chromium_path() is None,
    reason="LOUD SKIP: chromium is not installed (.ci/run installs it; Debian: apt-get install chromium)",
)

QUESTION = "Where is the company Ava Smith works for headquartered ?"
DOCS = [
    [
        {"id": "p1-works", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs .", "score": 3.1},
        {"id": "p9-born", "title": "Bo Smith", "text": "Bo Smith was born in Korla .", "score": 1.2},
    ],
    [{"id": "c1-hq", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar .", "score": 2.0}],
]


def _row(system, qid, dataset, question, answer, em, turns, docs, gold_docs, gold=("Velmar",)):
    return {
        "system": system,
        "id": qid,
        "sample": 0,
        "question": question,
        "golden_answers": list(gold),
        "answer": answer,
        "em": em,
        "f1": em,
        "finish_reason": "answer",
        "dataset": dataset,
        "turns": turns,
        "retrieved_docs": docs,
        "gold_docs": gold_docs,
    }


def _eval_dir(tmp_path):
    """Three questions, two systems, three data sets: q0 both right (2wiki), q1 sft right and rag
    wrong (hotpotqa: the only disagreement, not the first question in the file), q2 both wrong
    (musique, gold documents named by title as on real data)."""
    d = tmp_path / "eval"
    d.mkdir()
    info = {"role": "env", "text": "\n<information> ... </information>\n"}
    sft_turns = [
        {"role": "model", "text": "<search> Ava Smith works for </search>"},
        info,
        {
            "role": "model",
            "text": "<think> Ava Smith works for Zentro Labs . </think> <search> Zentro Labs is headquartered in </search>",
        },
        info,
        {"role": "model", "text": "<answer> Velmar </answer>"},
    ]
    q0 = "Who founded Zentro Labs ?"
    q2 = "Where was Bo Smith born ?"
    q2_docs = [[{"id": "m7", "title": "Korla Town ", "text": "Korla Town lies on a river .", "score": 1.0}]]
    model = [{"role": "model", "text": "<search> x </search>"}, {"role": "model", "text": "<answer> y </answer>"}]
    one_search = [model[0], info, model[1]]
    rows = [
        _row("sft", "q0", "2wiki", q0, "Ava Smith", 1.0, one_search, [DOCS[0]], ["p1-works"], gold=("Ava Smith",)),
        _row("sft", "q1", "hotpotqa", QUESTION, "Velmar", 1.0, sft_turns, DOCS, ["p1-works", "c1-hq"]),
        _row("sft", "q2", "musique", q2, "Velmar", 0.0, one_search, q2_docs, ["korla town"], gold=("Korla",)),
        _row("rag", "q0", "2wiki", q0, "Ava Smith", 1.0, [info], [DOCS[0]], ["p1-works"], gold=("Ava Smith",)),
        _row(
            "rag",
            "q1",
            "hotpotqa",
            QUESTION,
            "Korla </b><script>alert(1)</script>",
            0.0,
            [info],
            [DOCS[0]],
            ["p1-works", "c1-hq"],
        ),
        _row("rag", "q2", "musique", q2, "Velmar", 0.0, [info], q2_docs, ["korla town"], gold=("Korla",)),
    ]
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _parts(full: str) -> tuple[str, str]:
    """What the script rendered: the question list and the selected question's columns."""
    questions = full.split('<nav id="questions">', 1)[1].split("</nav>", 1)[0]
    detail = full.split('<section id="detail">', 1)[1].split("</section>", 1)[0]
    return questions, detail


def test_viewer_groups_by_question_and_opens_on_a_disagreement(tmp_path):
    page = tmp_path / "viewer.html"
    assert write_viewer([_eval_dir(tmp_path)], page) == 6
    full = dump_dom(page)
    questions, detail = _parts(full)
    assert "3 of 3 questions shown · systems disagree on 1" in full
    assert questions.count('class="item') == 3
    # q1 is the only question where the systems disagree: the page opens on it, not on q0
    assert 'class="item sel" data-key="hotpotqa/q1"' in questions
    assert detail.count(QUESTION) == 1 and "systems disagree" in detail
    # every system's trajectory for that question, side by side, marked right or wrong
    assert 'class="sys ok" data-system="sft"' in detail and 'class="sys bad" data-system="rag"' in detail
    assert detail.index('data-system="sft"') < detail.index('data-system="rag"')
    # gold docs: p1-works twice (sft step 1, rag) and c1-hq once; the distractor is not gold
    assert detail.count('class="doc gold" data-doc="p1-works"') == 2
    assert detail.count('class="doc gold" data-doc="c1-hq"') == 1
    assert 'class="doc" data-doc="p9-born"' in detail
    assert "<script>alert(1)</script>" not in questions + detail  # model output is escaped
    assert "Korla &lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in detail
    assert 'id="outcome"' in full and 'id="dataset"' in full


def test_viewer_filters_by_outcome_and_data_set(tmp_path):
    page = tmp_path / "viewer.html"
    write_viewer([_eval_dir(tmp_path)], page)

    questions, detail = _parts(full := dump_dom(page, fragment="outcome=all-wrong"))
    assert "1 of 3 questions shown" in full and 'class="item sel" data-key="musique/q2"' in questions
    assert 'class="sys bad" data-system="sft"' in detail and 'class="sys bad" data-system="rag"' in detail
    assert detail.count('class="doc gold" data-doc="m7"') == 2  # gold by title, case and spaces aside

    questions, detail = _parts(full := dump_dom(page, fragment="dataset=2wiki"))
    assert "1 of 3 questions shown" in full and 'data-key="2wiki/q0"' in questions
    assert 'class="sys ok" data-system="sft"' in detail and 'class="sys ok" data-system="rag"' in detail

    questions, _ = _parts(full := dump_dom(page, fragment="outcome=wrong%3Arag"))
    assert "2 of 3 questions shown" in full and 'class="item sel" data-key="hotpotqa/q1"' in questions
    assert 'data-key="musique/q2"' in questions and "2wiki/q0" not in questions

    _, detail = _parts(full := dump_dom(page, fragment="dataset=musique&outcome=correct%3Asft"))
    assert "0 of 3 questions shown" in full and "no question matches these filters" in detail


def test_viewer_counts_the_questions_past_its_cap(tmp_path):
    """An eval of 3 questions in a page capped at 2 says "2 of 3", not "2 of 2"."""
    page = tmp_path / "viewer.html"
    assert write_viewer([_eval_dir(tmp_path)], page, max_per_system=2) == 4
    questions, _ = _parts(full := dump_dom(page))
    assert "2 of 3 questions shown" in full and questions.count('class="item') == 2


def test_viewer_screenshot(tmp_path):
    page = tmp_path / "viewer.html"
    write_viewer([_eval_dir(tmp_path)], page)
    png = screenshot(page, tmp_path / "viewer.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
