"""The synthesis journal: fsynced appends, torn last lines dropped, no duplicate ids, one writer."""

import pytest

from r3rag.util.errors import UserError
from r3rag.util.journal import Journal


def test_reopen_resumes_and_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append({"id": "a", "x": 1})
        j.append({"id": "b", "x": 2})
    with open(path, "ab") as f:
        f.write(b'{"id": "c", "x"')  # a crash mid-write
    with Journal(path) as j:
        assert j.done == {"a", "b"} and [r["x"] for r in j.rows] == [1, 2]
        j.append({"id": "c", "x": 3})
        with pytest.raises(ValueError, match="already finished"):
            j.append({"id": "a"})
    assert [line[:10] for line in path.read_text().splitlines()] == ['{"id": "a"', '{"id": "b"', '{"id": "c"']


def test_a_second_writer_is_refused(tmp_path):
    with Journal(tmp_path / "j.jsonl"):
        with pytest.raises(UserError, match="another run"):
            Journal(tmp_path / "j.jsonl").__enter__()


def test_a_duplicated_id_in_the_file_is_an_error(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(UserError, match=r"j.jsonl:2: id 'a' appears twice"):
        Journal(path).__enter__()


def test_appends_reach_the_os_at_once_and_the_disk_within_a_second(tmp_path, monkeypatch):
    """A killed process loses nothing appended (the line is in the OS before append returns); the
    fsync that guards against a power cut runs once a second and on close, not once per item."""
    import r3rag.util.journal as journal

    syncs, now = [], [0.0]
    monkeypatch.setattr(journal.os, "fsync", lambda fd: syncs.append(fd))
    monkeypatch.setattr(journal.time, "monotonic", lambda: now[0])
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        for i in range(500):
            j.append({"id": str(i)})
        assert len(path.read_text().splitlines()) == 500 and syncs == []  # readable by another process now
        now[0] = 1.5
        j.append({"id": "late"})
        assert len(syncs) == 1
    assert len(syncs) == 2  # the close
