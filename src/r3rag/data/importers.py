"""Convert QA files (HotpotQA, 2WikiMultiHopQA, MuSiQue, FlashRAG) into r3rag's one question schema.

Every question becomes FlashRAG-style JSONL:
    {"id", "question", "golden_answers": [main, aliases...],
     "metadata": {"dataset", "type"/"level" (when present), "supporting_titles": [...],
                  "paragraphs": [{"idx", "title", "text", "is_supporting", ["sentences"]}],
                  "question_decomposition" (MuSiQue), "hops" (when derivable), ...}}
Source fields that are not part of the schema (evidences, entity_ids, supporting_facts, answerable,
source, ...) are kept in `metadata`, so nothing is lost.

Inputs are a JSON list (the original dataset files) or JSONL. HotpotQA/2Wiki/MuSiQue records may be
in their original layout or already FlashRAG-shaped with the original fields inside `metadata`
(as in the shared data): both are read, and so is the column layout of the `datasets` library and
of FlashRAG's files on the hub (r3rag.data.flashrag).

Usage:
    questions, fmt = import_questions("hotpot_dev_distractor_v1.json", fmt="auto", limit=0)
    corpus = corpus_from_questions(questions)     # deduplicated [{"id", "title", "text"}]
    write_atomic("out.jsonl", questions)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from r3rag.data.flashrag import normalize_layout
from r3rag.util.errors import UserError
from r3rag.util.jsonl import expect_object, parse_line, unique_by_id

FORMATS = ("auto", "hotpotqa", "2wiki", "musique", "flashrag")
_DATASET = {"hotpotqa": "hotpotqa", "2wiki": "2wikimultihopqa", "musique": "musique"}
# Source fields consumed into the schema's own fields, so not copied into metadata again.
_CONSUMED = {
    "_id",
    "id",
    "question",
    "answer",
    "answer_aliases",
    "aliases",
    "golden_answers",
    "context",
    "paragraphs",
    "metadata",
    "supporting_titles",
    "hops",
}
# Metadata fields that are rebuilt from the evidence; any other metadata field is kept as it is.
_REBUILT = {"paragraphs", "supporting_titles", "hops"}


# ---------------------------------------------------------------- reading


def iter_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line, record) from a JSON list or a JSONL file; every parse error names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = raw[: e.start].count(b"\n") + 1
        raise UserError(f"{path}:{lineno}: not valid UTF-8") from None
    text = text.lstrip("\ufeff")  # a BOM is harmless; don't call it malformed JSON
    if text.lstrip().startswith("["):
        yield from _iter_json_array(text, path)
    else:
        yield from _iter_jsonl(text, path)


def _iter_jsonl(text: str, path: Path) -> Iterator[tuple[int, dict]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        row = parse_line(line, f"{path}:{lineno}")
        if row is not None:
            yield lineno, row


def _iter_json_array(text: str, path: Path) -> Iterator[tuple[int, dict]]:
    """Decode a top-level list element by element, so each record knows the line it starts on."""
    dec = json.JSONDecoder()
    pos, lineno, counted = text.index("[") + 1, 1, 0

    def line_at(p: int) -> int:
        nonlocal lineno, counted  # count newlines incrementally: O(file), not O(file * records)
        lineno += text.count("\n", counted, p)
        counted = p
        return lineno

    def skip_ws(p: int) -> int:
        while p < len(text) and text[p] in " \t\r\n":
            p += 1
        return p

    pos = skip_ws(pos)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        try:
            row, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
        yield line_at(pos), expect_object(row, f"{path}:{line_at(pos)}")
        pos = skip_ws(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            if text[pos + 1 :].strip():
                raise UserError(f"{path}:{line_at(pos)}: malformed JSON (extra data after the list)")
            return
        raise UserError(f"{path}:{line_at(min(pos, len(text)))}: malformed JSON (expected ',' or ']')")


# ---------------------------------------------------------------- format detection


def detect_format(row: dict, where: str) -> str:
    """Guess the format from one record's keys; refuse to guess when two formats fit."""
    fits = []
    if "context" in row and "supporting_facts" in row:
        if "evidences" in row or "entity_ids" in row:
            fits.append("2wiki")
        elif "level" in row:
            fits.append("hotpotqa")
        else:
            raise UserError(
                f"{where}: cannot tell HotpotQA from 2WikiMultiHopQA (no 'level', 'evidences' "
                "or 'entity_ids'); pass --format hotpotqa or --format 2wiki"
            )
    if "paragraphs" in row:
        fits.append("musique")
    if "golden_answers" in row:
        fits.append("flashrag")
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise UserError(
            f"{where}: cannot detect the format from keys {sorted(row)}; pass --format ({', '.join(FORMATS[1:])})"
        )
    raise UserError(f"{where}: ambiguous format (looks like {' and '.join(fits)}); pass --format")


# ---------------------------------------------------------------- field helpers


def _flat(row: dict, where: str) -> dict:
    """Record fields with `metadata` merged underneath: shared files keep the originals there."""
    meta = row.get("metadata", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise UserError(f"{where}: field 'metadata' must be an object, got {type(meta).__name__}")
    return {**meta, **{k: v for k, v in row.items() if k != "metadata"}}


def _need(src: dict, where: str, *keys: str):
    for k in keys:
        if k in src:
            return src[k]
    raise UserError(f"{where}: missing field {keys[0]!r}")


def _string(value, where: str, field: str, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise UserError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise UserError(f"{where}: field {field!r} is empty")
    return value


def _list(value, where: str, field: str) -> list:
    if not isinstance(value, list):
        raise UserError(f"{where}: field {field!r} must be a list, got {type(value).__name__}")
    return value


def _qid(src: dict, where: str) -> str:
    qid = _need(src, where, "id", "_id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or str(qid).strip() == "":
        raise UserError(f"{where}: field 'id' must be a non-empty string or integer")
    return str(qid)


def _answers(src: dict, where: str) -> list[str]:
    """golden_answers = [main answer, aliases...], stripped and de-duplicated, main answer first."""
    # golden_answers wins: FlashRAG-shaped files may also keep the bare main answer in metadata.
    if "golden_answers" in src:
        answers = _list(src["golden_answers"], where, "golden_answers")
        if not answers:
            raise UserError(f"{where}: field 'golden_answers' is an empty list")
        answers = [_string(a, where, "golden_answers") for a in answers]
    else:
        main = _string(_need(src, where, "answer"), where, "answer")
        aliases = src.get("answer_aliases", src.get("aliases")) or []
        answers = [main] + [_string(a, where, "answer_aliases") for a in _list(aliases, where, "answer_aliases")]
    out = []
    for a in (a.strip() for a in answers):
        if a and a not in out:
            out.append(a)
    return out


def _supporting_facts_titles(src: dict, where: str) -> list[str]:
    titles = []
    for fact in _list(src.get("supporting_facts") or [], where, "supporting_facts"):
        if not isinstance(fact, list) or len(fact) != 2 or not isinstance(fact[0], str):
            raise UserError(f"{where}: field 'supporting_facts' must hold [title, sentence_index] pairs")
        if fact[0] not in titles:
            titles.append(fact[0])
    return titles


def _context_paragraphs(context, where: str) -> list[dict]:
    """HotpotQA/2Wiki `context: [[title, [sentences]]]` -> paragraph dicts (is_supporting set later)."""
    paras = []
    for i, item in enumerate(_list(context, where, "context")):
        ok = (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        )
        if not ok:
            raise UserError(f"{where}: field 'context' item {i} must be [title, [sentences]]")
        # Sentences carry their own leading spaces inconsistently; one space between stripped ones
        # is what the shared files use, so imports of either layout give the same text.
        text = " ".join(s.strip() for s in item[1])
        paras.append({"idx": i, "title": item[0], "text": text, "is_supporting": False, "sentences": item[1]})
    return paras


def _dict_paragraphs(paragraphs, where: str) -> list[dict]:
    """MuSiQue/FlashRAG paragraph dicts (`text` or MuSiQue's `paragraph_text`) -> paragraph dicts."""
    paras = []
    for i, p in enumerate(_list(paragraphs, where, "paragraphs")):
        pw = f"{where}: paragraph {i}"
        if not isinstance(p, dict):
            raise UserError(f"{pw} must be an object")
        text = _string(_need(p, pw, "text", "paragraph_text"), pw, "text", empty_ok=True)
        title = _string(p.get("title", ""), pw, "title", empty_ok=True)
        sup = p.get("is_supporting", False)
        if not isinstance(sup, bool):
            raise UserError(f"{pw}: field 'is_supporting' must be true or false")
        para = {"idx": p.get("idx", i), "title": title, "text": text, "is_supporting": sup}
        if isinstance(p.get("sentences"), list):
            para["sentences"] = p["sentences"]
        paras.append(para)
    return paras


def _paragraphs(src: dict, where: str) -> list[dict]:
    if "context" in src:
        return _context_paragraphs(src["context"], where)
    if "paragraphs" in src:
        return _dict_paragraphs(src["paragraphs"], where)
    return []


def _supporting_titles(src: dict, paras: list[dict], where: str) -> list[str]:
    """Gold titles from whichever evidence the source has: supporting_facts, flags, or a title list."""
    titles = _supporting_facts_titles(src, where)
    for t in _list(src.get("supporting_titles") or [], where, "supporting_titles"):
        if _string(t, where, "supporting_titles") not in titles:
            titles.append(t)
    for p in paras:
        if p["is_supporting"] and p["title"] not in titles:
            titles.append(p["title"])
    if titles:  # flags follow the titles, so both views of the gold agree
        for p in paras:
            p["is_supporting"] = p["is_supporting"] or p["title"] in titles
    return titles


def _hops(src: dict, titles: list[str], where: str):
    qd = src.get("question_decomposition")
    if qd is not None:
        return len(_list(qd, where, "question_decomposition"))
    return len(titles) or None


# ---------------------------------------------------------------- one record


def convert_record(row: dict, fmt: str, where: str) -> dict:
    """One source record -> the r3rag question schema. `fmt` is a concrete format, not 'auto'."""
    row = normalize_layout(row)  # FlashRAG's / `datasets`' column layout of context and facts
    src = _flat(row, where)
    question = _string(_need(src, where, "question"), where, "question").strip()
    qid, answers = _qid(src, where), _answers(src, where)
    if fmt == "flashrag" and "golden_answers" not in row:
        raise UserError(f"{where}: missing field 'golden_answers'")
    if fmt == "musique" and "paragraphs" not in src:
        raise UserError(f"{where}: missing field 'paragraphs'")
    if fmt in ("hotpotqa", "2wiki") and "context" not in src and "paragraphs" not in src:
        raise UserError(f"{where}: missing field 'context'")
    paras = _paragraphs(src, where)
    titles = _supporting_titles(src, paras, where)
    meta = {k: v for k, v in (row.get("metadata") or {}).items() if k not in _REBUILT}
    meta.update({k: v for k, v in row.items() if k not in _CONSUMED})
    meta["dataset"] = src.get("dataset") or _DATASET.get(fmt) or "unknown"
    if titles or paras:
        meta["supporting_titles"] = titles
    if paras:
        meta["paragraphs"] = paras
    hops = _hops(src, titles, where)
    if hops:
        meta["hops"] = hops
    return {"id": qid, "question": question, "golden_answers": answers, "metadata": meta}


def import_questions(path: str | Path, fmt: str = "auto", limit: int = 0) -> tuple[list[dict], str]:
    """All records of `path` converted; returns (questions, the format used). Errors name file:line."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if limit < 0:
        raise UserError(f"--limit {limit}: must be 0 (all) or more")

    def converted():
        nonlocal fmt
        for lineno, row in iter_records(path):
            where = f"{path}:{lineno}"
            if fmt == "auto":
                fmt = detect_format(row, where)
            yield where, convert_record(row, fmt, where)

    out = unique_by_id(converted(), limit)
    if not out:
        raise UserError(f"{path}: no records")
    return out, fmt


# ---------------------------------------------------------------- corpus and writing


def doc_id(title: str, text: str) -> str:
    """Stable across runs and files: the same paragraph always gets the same id."""
    return "p-" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


def corpus_from_questions(questions: Iterable[dict]) -> list[dict]:
    """The questions' context paragraphs as a {id, title, text} corpus; identical title+text kept once."""
    docs, seen = [], set()
    for q in questions:
        for p in q["metadata"].get("paragraphs", []):
            if not p["text"].strip():  # nothing to retrieve; empty docs only confuse an index
                continue
            key = (p["title"], p["text"])
            if key not in seen:
                seen.add(key)
                docs.append({"id": doc_id(*key), "title": p["title"], "text": p["text"]})
    return docs


def write_atomic(outputs: dict[Path, list[dict]]) -> None:
    """Write every file to a temp name, then rename them all: an error leaves no partial output."""
    tmps = {}
    try:
        for path, rows in outputs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmps[path] = tmp
            with open(tmp, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for path, tmp in tmps.items():
            os.replace(tmp, path)
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
