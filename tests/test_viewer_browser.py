"""The HTML viewer rendered by a real headless Chromium: questions shown, gold documents highlighted."""

import json

import pytest

from r3rag.browser import chromium_path, dump_dom, screenshot
from r3rag.report import write_viewer

pytestmark = pytest.mark.skipif(
    chromium_path() is None,
    reason="LOUD SKIP: chromium is not installed (.ci/run installs it; Debian: apt-get install chromium)",
)


def _eval_dir(tmp_path):
    d = tmp_path / "eval"
    d.mkdir()
    docs = [
        [
            {"id": "p1-works", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs .", "score": 3.1},
            {"id": "p9-born", "title": "Bo Smith", "text": "Bo Smith was born in Korla .", "score": 1.2},
        ],
        [{"id": "c1-hq", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar .", "score": 2.0}],
    ]
    rows = [
        {
            "system": "sft",
            "id": "q1",
            "question": "Where is the company Ava Smith works for headquartered ?",
            "golden_answers": ["Velmar"],
            "answer": "Velmar",
            "em": 1.0,
            "f1": 1.0,
            "finish_reason": "answer",
            "turns": [
                {"role": "model", "text": "<search> Ava Smith works for </search>"},
                {"role": "env", "text": "\n<information> ... </information>\n"},
                {
                    "role": "model",
                    "text": "<think> Ava Smith works for Zentro Labs . </think> <search> Zentro Labs is headquartered in </search>",
                },
                {"role": "env", "text": "\n<information> ... </information>\n"},
                {"role": "model", "text": "<answer> Velmar </answer>"},
            ],
            "retrieved_docs": docs,
            "gold_docs": ["p1-works", "c1-hq"],
        },
        {
            "system": "rag",
            "id": "q1",
            "question": "Where is the company Ava Smith works for headquartered ?",
            "golden_answers": ["Velmar"],
            "answer": "Korla </b><script>alert(1)</script>",
            "em": 0.0,
            "f1": 0.0,
            "finish_reason": "answer",
            "turns": [{"role": "env", "text": "\n<information> ... </information>\n"}],
            "retrieved_docs": [docs[0]],
            "gold_docs": ["p1-works", "c1-hq"],
        },
    ]
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_viewer_renders_questions_and_highlights_gold_documents(tmp_path):
    page = tmp_path / "viewer.html"
    write_viewer([_eval_dir(tmp_path)], page)
    full = dump_dom(page)
    dom = full.split('<div id="list">', 1)[1].split("<script>", 1)[0]  # what the script rendered
    assert "2 shown" in full
    assert dom.count("Where is the company Ava Smith works for headquartered ?") == 2
    # gold docs: p1-works twice (sft step 1, rag) and c1-hq once; the distractor is not gold
    assert dom.count('class="doc gold" data-doc="p1-works"') == 2
    assert dom.count('class="doc gold" data-doc="c1-hq"') == 1
    assert 'class="doc" data-doc="p9-born"' in dom
    assert "<script>alert(1)</script>" not in dom  # model output is escaped
    assert 'id="fails"' in full and 'class="q bad"' in dom and 'class="q ok"' in dom


def test_viewer_screenshot(tmp_path):
    page = tmp_path / "viewer.html"
    write_viewer([_eval_dir(tmp_path)], page)
    png = screenshot(page, tmp_path / "viewer.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
