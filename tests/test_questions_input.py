"""Stages taking questions from an imported questions file: schema checks with file:line, content-hashed input."""

import json

import pytest

from r3rag.stages.common import file_input, load_questions
from r3rag.util.errors import UserError

GOOD = {"id": 7, "question": "Who?", "golden_answers": ["Ava"], "metadata": {"dataset": "x"}}


def write(tmp_path, rows, name="q.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_loads_the_schema_with_string_ids_and_limit(tmp_path):
    p = write(tmp_path, [GOOD, "", {**GOOD, "id": "b", "metadata": None}, {**GOOD, "id": "c"}])
    qs = load_questions(p)
    assert [q["id"] for q in qs] == ["7", "b", "c"] and qs[1]["metadata"] == {}
    assert [q["id"] for q in load_questions(p, limit=2)] == ["7", "b"]


@pytest.mark.parametrize(
    "bad, line, needle",
    [
        ({"question": "Who?", "golden_answers": ["a"]}, 2, "missing required field 'id'"),
        ({**GOOD, "id": "z", "golden_answers": []}, 2, "golden_answers"),
        ({**GOOD, "id": "z", "golden_answers": "Ava"}, 2, "golden_answers"),
        ({**GOOD, "id": "z", "question": " "}, 2, "'question'"),
        ({**GOOD, "id": "z", "metadata": [1]}, 2, "'metadata'"),
        ({**GOOD}, 2, "duplicate id '7' (first on line 1)"),
        ("{not json", 2, "malformed JSON"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, bad, line, needle):
    p = write(tmp_path, [GOOD, bad])
    with pytest.raises(UserError) as e:
        load_questions(p)
    assert f"{p}:{line}:" in str(e.value) and needle in str(e.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_questions(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="no questions"):
        load_questions(write(tmp_path, [""]))


def test_file_input_is_hashed_by_content_not_path(tmp_path):
    a, b = write(tmp_path, [GOOD], "a.jsonl"), write(tmp_path, [GOOD], "b.jsonl")
    assert file_input(a).content_hash == file_input(b).content_hash
    c = write(tmp_path, [{**GOOD, "id": 8}], "c.jsonl")
    assert file_input(c).content_hash != file_input(a).content_hash
    assert file_input(a).as_input()["path"] == str(a)
