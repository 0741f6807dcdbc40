"""JSONL reading and writing with errors that name the file and line.

Usage:
    rows = read_jsonl(path, required=("id", "question"))
    write_jsonl(path, rows)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from r3rag.util.errors import UserError


def parse_line(line: str, where: str) -> dict | None:
    """One JSONL line as an object (None for a blank line); errors name `where` (file:line)."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: malformed JSON ({e.msg})") from None
    return expect_object(row, where)


def expect_object(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def read_json(path: str | Path):
    """A whole JSON file; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path}: not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None


def iter_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> Iterator[dict]:
    for _, row in iter_numbered(path, required):
        yield row


def iter_numbered(path: str | Path, required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line, so callers' own errors can name the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{path}:{lineno}: not valid UTF-8") from None
            row = parse_line(line, f"{path}:{lineno}")
            if row is None:
                continue
            missing = [k for k in required if k not in row]
            if missing:
                raise UserError(f"{path}:{lineno}: missing required field {missing[0]!r}")
            yield lineno, row


def unique_by_id(records: Iterable[tuple[str, dict]], limit: int = 0) -> list[dict]:
    """(where, record) pairs -> the records, stopping after `limit` (0 = all); a repeated `id`
    is an error naming both lines (`where` is "file:line")."""
    out, seen = [], {}
    for where, rec in records:
        if rec["id"] in seen:
            raise UserError(f"{where}: duplicate id {rec['id']!r} (first on line {seen[rec['id']].rsplit(':', 1)[-1]})")
        seen[rec["id"]] = where
        out.append(rec)
        if limit and len(out) >= limit:
            break
    return out


def read_jsonl(path: str | Path, required: tuple[str, ...] = (), allow_empty: bool = False) -> list[dict]:
    rows = list(iter_jsonl(path, required))
    if not rows and not allow_empty:
        raise UserError(f"{path}: file is empty")
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n
