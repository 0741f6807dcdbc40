"""Passage corpora: FlashRAG JSONL (`id`, `contents` = "title\\ntext") or `{id, title, text}` JSONL.

Usage:
    docs = load_corpus("corpus.jsonl")   # list of {"id", "title", "text"}
"""

from __future__ import annotations

from pathlib import Path

from r3rag.errors import UserError
from r3rag.jsonl import iter_numbered, unique_by_id


def normalize_doc(row: dict, where: str) -> dict:
    if "id" not in row:
        raise UserError(f"{where}: missing required field 'id'")
    if "contents" in row and "text" not in row:
        if not isinstance(row["contents"], str):
            raise UserError(f"{where}: field 'contents' must be a string")
        title, _, text = row["contents"].partition("\n")
        if not text:  # no title line
            title, text = "", title
        title = title.strip().strip('"')
    elif "text" in row:
        title, text = row.get("title", ""), row["text"]
        if not isinstance(text, str) or not isinstance(title, str):
            raise UserError(f"{where}: fields 'title' and 'text' must be strings")
    else:
        raise UserError(f"{where}: missing required field 'contents' (or 'text')")
    return {"id": str(row["id"]), "title": title, "text": text}


def load_corpus(path: str | Path) -> list[dict]:
    docs = unique_by_id((f"{path}:{n}", normalize_doc(row, f"{path}:{n}")) for n, row in iter_numbered(path))
    if not docs:
        raise UserError(f"{path}: corpus is empty")
    return docs
