"""`r3rag import`: original HotpotQA / 2Wiki / MuSiQue / FlashRAG files -> one question schema (+ corpus)."""

import json

import pytest

from r3rag.data.corpus import load_corpus
from r3rag.data.importers import corpus_from_questions, detect_format, import_questions
from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag, r3rag_inprocess

HOTPOT = [
    {
        "_id": "h1",
        "question": "Which band did the singer of X join?",
        "answer": "Band B",
        "supporting_facts": [["Singer A", 0], ["Band B", 1], ["Singer A", 1]],
        "context": [
            ["Singer A", ["Singer A is a singer.", " She joined Band B."]],
            ["Band B", ["Band B is a band.", " It formed in 1990."]],
            ["Other", ["Unrelated text."]],
        ],
        "type": "bridge",
        "level": "easy",
    },
    {
        "_id": "h2",
        "question": "Are A and B both bands?",
        "answer": "yes",
        "supporting_facts": [["Band B", 0], ["Band C", 0]],
        "context": [["Band B", ["Band B is a band.", " It formed in 1990."]], ["Band C", ["Band C is a band."]]],
        "type": "comparison",
        "level": "hard",
    },
]
TWOWIKI = [
    {
        "_id": "w1",
        "question": "Who is the father of the director of F?",
        "answer": "Dad",
        "answer_aliases": ["Daddy", "Dad"],
        "type": "compositional",
        "supporting_facts": [["F", 0], ["Director", 1]],
        "evidences": [["F", "director", "Director"]],
        "entity_ids": "Q1_Q2",
        "context": [
            ["F", ["F is a film directed by Director."]],
            ["Director", ["Director was born.", "His father is Dad."]],
        ],
    },
]
MUSIQUE = [
    {
        "id": "2hop__1_2",
        "question": "Where was the founder of Q born?",
        "answer": "Paris",
        "answer_aliases": ["Paris, France"],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "Q", "paragraph_text": "Q was founded by Z.", "is_supporting": True},
            {"idx": 1, "title": "Z", "paragraph_text": "Z was born in Paris.", "is_supporting": True},
            {"idx": 2, "title": "Noise", "paragraph_text": "Nothing here.", "is_supporting": False},
        ],
        "question_decomposition": [
            {"id": 1, "question": "Q >> founded by", "answer": "Z", "paragraph_support_idx": 0},
            {"id": 2, "question": "where was #1 born", "answer": "Paris", "paragraph_support_idx": 1},
        ],
    },
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _check_questions(qs):
    for q in qs:
        assert q["golden_answers"] and all(isinstance(a, str) and a for a in q["golden_answers"])
        meta = q["metadata"]
        titles = {p["title"] for p in meta.get("paragraphs", [])}
        assert set(meta.get("supporting_titles", [])) <= titles, q["id"]
        assert {p["title"] for p in meta.get("paragraphs", []) if p["is_supporting"]} == set(meta["supporting_titles"])


def test_hotpotqa_json_list_and_jsonl(tmp_path):
    src = tmp_path / "hotpot.json"
    src.write_text(json.dumps(HOTPOT, indent=2))
    qs, fmt = import_questions(src)
    assert fmt == "hotpotqa" and [q["id"] for q in qs] == ["h1", "h2"]
    m = qs[0]["metadata"]
    assert m["dataset"] == "hotpotqa" and m["type"] == "bridge" and m["level"] == "easy"
    assert m["supporting_titles"] == ["Singer A", "Band B"] and m["hops"] == 2
    assert m["paragraphs"][0] == {
        "idx": 0,
        "title": "Singer A",
        "text": "Singer A is a singer. She joined Band B.",
        "is_supporting": True,
        "sentences": HOTPOT[0]["context"][0][1],
    }
    assert m["supporting_facts"] == HOTPOT[0]["supporting_facts"]  # kept for sentence-level gold
    _check_questions(qs)
    # The same records one per line, and with --format given, convert identically.
    assert import_questions(_jsonl(tmp_path / "hotpot.jsonl", HOTPOT), "hotpotqa")[0] == qs
    assert import_questions(src, limit=1)[0] == qs[:1]


def test_2wiki_keeps_aliases_and_evidence(tmp_path):
    qs, fmt = import_questions(_jsonl(tmp_path / "w.jsonl", TWOWIKI))
    assert fmt == "2wiki"
    q = qs[0]
    assert q["golden_answers"] == ["Dad", "Daddy"]
    assert q["metadata"]["dataset"] == "2wikimultihopqa" and q["metadata"]["evidences"] and q["metadata"]["entity_ids"]
    assert q["metadata"]["hops"] == 2
    _check_questions(qs)


def test_musique_and_corpus(tmp_path):
    src = tmp_path / "m.json"
    src.write_text(json.dumps(MUSIQUE))
    qs, fmt = import_questions(src)
    assert fmt == "musique"
    m = qs[0]["metadata"]
    assert qs[0]["golden_answers"] == ["Paris", "Paris, France"]
    assert m["hops"] == 2 and m["supporting_titles"] == ["Q", "Z"] and m["answerable"] is True
    assert len(m["question_decomposition"]) == 2 and m["paragraphs"][1]["text"] == "Z was born in Paris."
    # Paragraphs shared by two questions appear once in the corpus, with a stable id.
    hot, _ = import_questions(_jsonl(tmp_path / "h.jsonl", HOTPOT))
    docs = corpus_from_questions(hot + qs)
    assert len(docs) == 4 + 3  # Band B is in both HotpotQA questions
    assert docs == corpus_from_questions(hot + qs) and len({d["id"] for d in docs}) == len(docs)


def test_flashrag_is_validated_and_normalised(tmp_path):
    rows = [
        {"id": 7, "question": " Who? ", "golden_answers": [" A ", "A", "B"]},
        {
            "id": "x",
            "question": "What?",
            "golden_answers": ["C"],
            "metadata": {"answer": "C", "paragraphs": [{"title": "T", "text": "t", "is_supporting": True}]},
        },
    ]
    qs, fmt = import_questions(_jsonl(tmp_path / "f.jsonl", rows))
    assert fmt == "flashrag"
    assert qs[0] == {"id": "7", "question": "Who?", "golden_answers": ["A", "B"], "metadata": {"dataset": "unknown"}}
    assert qs[1]["metadata"]["supporting_titles"] == ["T"] and qs[1]["metadata"]["answer"] == "C"


@pytest.mark.parametrize(
    "rows, needle",
    [
        ([{"id": "1", "question": "q", "golden_answers": "A"}], "'golden_answers' must be a list"),
        ([{"id": "1", "question": "q", "golden_answers": []}], "'golden_answers' is an empty list"),
        ([{"id": "1", "question": 3, "golden_answers": ["A"]}], "'question' must be a string"),
        ([{"id": "1", "golden_answers": ["A"]}], "missing field 'question'"),
        ([{"question": "q", "golden_answers": ["A"]}], "missing field 'id'"),
        ([{"_id": "1", "question": "q", "answer": "a", "context": [], "supporting_facts": []}], "cannot tell HotpotQA"),
        ([{**MUSIQUE[0], "golden_answers": ["Paris"]}], "ambiguous format"),
        ([{"q": 1}], "cannot detect the format"),
        ([HOTPOT[0], {**HOTPOT[1], "context": [["T", "not a list"]]}], "'context' item 0"),
    ],
)
def test_bad_records(tmp_path, rows, needle):
    src = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(UserError, match=needle) as e:
        import_questions(src)
    assert f"bad.jsonl:{len(rows)}:" in str(e.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(UserError, match="nope.json: file not found"):
        import_questions(tmp_path / "nope.json")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(HOTPOT[0]).encode() + b"\n" + '{"question": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="latin.jsonl:2: not valid UTF-8"):
        import_questions(latin)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(UserError, match="no records"):
        import_questions(empty)
    with pytest.raises(UserError, match="--format 'squad'"):
        import_questions(latin, "squad")


def test_cli_writes_questions_and_corpus(tmp_path):
    src = tmp_path / "hotpot.json"
    src.write_text(json.dumps(HOTPOT))
    out, corpus = tmp_path / "o" / "q.jsonl", tmp_path / "c.jsonl"
    res = r3rag("import", str(src), "--out", str(out), "--corpus-out", str(corpus))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(out)
    assert "2 questions" in res.stderr and "4 unique paragraphs" in res.stderr and len(res.stderr.splitlines()) == 1
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["h1", "h2"]
    assert len(load_corpus(corpus)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "hotpot.json", "o"]  # no temp files left


@pytest.mark.parametrize(
    "name, content, needles",
    [
        # JSON list: the error names the line the bad record starts on.
        (
            "list.json",
            "[\n" + json.dumps(HOTPOT[0]) + ",\n" + json.dumps({**HOTPOT[1], "question": None}) + "\n]",
            ["list.json:3:", "'question' must be a string"],
        ),
        (
            "lines.jsonl",
            json.dumps(HOTPOT[0]) + "\n" + '{"_id": "h2", "question": \n',
            ["lines.jsonl:2:", "malformed JSON"],
        ),
        (
            "dup.jsonl",
            json.dumps(HOTPOT[0]) + "\n\n" + json.dumps(HOTPOT[0]) + "\n",
            ["dup.jsonl:3:", "duplicate id 'h1'"],
        ),
    ],
)
def test_cli_errors_leave_no_output(tmp_path, name, content, needles):
    src = tmp_path / name
    src.write_text(content)
    out, corpus = tmp_path / "q.jsonl", tmp_path / "c.jsonl"
    assert_one_line_error(r3rag_inprocess("import", str(src), "--out", str(out), "--corpus-out", str(corpus)), *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


REAL = [  # file, questions, unique corpus paragraphs
    ("hotpotqa/dev_hoprag_examples.jsonl", 10, 100),
    ("hotpotqa/train_hipporag_sample.jsonl", 100, 994),
    ("2wikimultihopqa/dev_hoprag_examples.jsonl", 10, 99),
    ("musique/dev_hoprag_examples.jsonl", 10, 200),
    ("musique/train_hipporag_sample.jsonl", 100, 1890),
    ("hotpotqa/dev_distractor_ircot_subsample.jsonl", 400, 3897),
]


@pytest.mark.parametrize("rel, n_questions, n_paragraphs", REAL)
def test_real_files(shared_root, tmp_path, rel, n_questions, n_paragraphs):
    qs, _ = import_questions(shared_root / rel)
    assert len(qs) == n_questions
    _check_questions(qs)
    assert all(q["metadata"]["supporting_titles"] and q["metadata"]["hops"] >= 2 for q in qs)
    dataset = rel.split("/")[0]
    fmt = {"hotpotqa": "hotpotqa", "2wikimultihopqa": "2wiki", "musique": "musique"}[dataset]
    if "ircot" not in rel:  # these keep the original fields in metadata: the explicit format reads them too
        assert import_questions(shared_root / rel, fmt)[0] == qs
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in corpus_from_questions(qs)))
    assert len(load_corpus(corpus)) == n_paragraphs


def test_real_musique_hops(shared_root):
    qs, _ = import_questions(shared_root / "musique/train_hipporag_sample.jsonl")
    hops = [q["metadata"]["hops"] for q in qs]
    assert (hops.count(2), hops.count(3), hops.count(4)) == (68, 27, 5)  # as the shared README says


@pytest.mark.parametrize(
    "rel, fmt",
    [("hotpotqa/train_hipporag_sample.jsonl", "hotpotqa"), ("2wikimultihopqa/dev_hoprag_examples.jsonl", "2wiki")],
)
def test_original_layout_matches_shared_layout(shared_root, tmp_path, rel, fmt):
    """Rebuilding the original dataset layout from the shared rows and importing it gives the same questions."""
    shared, _ = import_questions(shared_root / rel)
    originals = []
    for line in (shared_root / rel).read_text().splitlines():
        r = json.loads(line)
        m = dict(r["metadata"])
        paras = m.pop("paragraphs")
        originals.append(
            {
                **m,
                "_id": r["id"],
                "question": r["question"],
                "answer": r["golden_answers"][0],
                "answer_aliases": r["golden_answers"][1:],
                "context": [[p["title"], p["sentences"]] for p in paras],
            }
        )
    src = tmp_path / "orig.json"
    src.write_text(json.dumps(originals))
    qs, detected = import_questions(src)
    assert detected == fmt
    assert [q["golden_answers"] for q in qs] == [q["golden_answers"] for q in shared]
    for a, b in zip(qs, shared):
        assert a["metadata"]["supporting_titles"] == b["metadata"]["supporting_titles"]
        assert [(p["title"], p["text"], p["is_supporting"]) for p in a["metadata"]["paragraphs"]] == [
            (p["title"], p["text"], p["is_supporting"]) for p in b["metadata"]["paragraphs"]
        ]


def test_cli_on_real_musique_with_limit(shared_root, tmp_path):
    out, corpus = tmp_path / "q.jsonl", tmp_path / "c.jsonl"
    res = r3rag(
        "import",
        str(shared_root / "musique/dev_hoprag_examples.jsonl"),
        "--format",
        "musique",
        "--limit",
        "3",
        "--out",
        str(out),
        "--corpus-out",
        str(corpus),
    )
    assert res.returncode == 0, res.stderr
    assert len(out.read_text().splitlines()) == 3 and len(load_corpus(corpus)) == 60
    assert detect_format(json.loads(out.read_text().splitlines()[0]), "x") == "flashrag"
