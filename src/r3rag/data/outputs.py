"""A data set's files in the data root, written from its downloaded hub files (r3rag.data.fetch calls it).

Each output the manifest names is one of:
    {"from": "hotpotqa/dev.jsonl", "take": [0, 400]}   questions of ranks 0-399 of that file
    {"from": ..., "take": "all"}                          every question, in rank order
    {"corpus_of": [{"from": ..., "take": [a, b]}, ...]}   the paragraphs those questions carry
    {"unzip": "retrieval-corpus/wiki18_100w.zip"}         the zip's JSONL passages, as they are
    {"sample_of": "<zip>", "count": 1000}                 that many of its passages (seeded)

A line's rank is its place in the order of sha256("<hub path>:<line number>"): a shuffle fixed by
the file, whose bytes the manifest pins, so the same manifest gives the same questions on every
machine; ranks 0-399 are a random sample, and a prefix of a file (`world.limits`) is one too.
Questions are converted to r3rag's schema (r3rag.data.importers) with ids prefixed by the data
set (`hotpotqa-dev_12`: FlashRAG's ids repeat across data sets) and `metadata.source` naming the
repo, file and commit. Every output is written to a temporary name and renamed when complete.

Usage:
    written = write_outputs(name, outputs, raw_dir, root, source_tag, progress)   # {path: rows}
"""

from __future__ import annotations

import hashlib
import os
import random
import zipfile
from pathlib import Path

from r3rag.data.importers import convert_record, corpus_from_questions, write_atomic
from r3rag.util.errors import UserError
from r3rag.util.jsonl import parse_line

MB = 1_000_000


def write_outputs(name: str, outputs: dict, raw_dir: Path, root: Path, source_tag, progress=None) -> dict[str, int]:
    """Write every output of data set `name`; returns {output path: rows written}."""
    question_outputs = {p: s for p, s in outputs.items() if "from" in s or "corpus_of" in s}
    written = _questions(name, question_outputs, raw_dir, root, source_tag, progress) if question_outputs else {}
    passages = {p: s for p, s in outputs.items() if "unzip" in s or "sample_of" in s}
    if passages:
        written.update(_passages(passages, raw_dir, root, progress))
    return written


def _take(spec: dict) -> range | None:
    """A selection's ranks (None = all)."""
    take = spec.get("take", "all")
    if take == "all":
        return None
    if not (isinstance(take, list) and len(take) == 2 and 0 <= take[0] <= take[1]):
        raise UserError(f"data manifest: 'take' must be \"all\" or [first, end], got {take!r}")
    return range(*take)


def _questions(name, outputs: dict, raw_dir: Path, root: Path, source_tag, progress) -> dict[str, int]:
    selections = []  # (output path or None for a pool's, source, ranks)
    for path, spec in outputs.items():
        if "from" in spec:
            selections.append((path, spec["from"], _take(spec)))
        for sel in spec.get("corpus_of", []):
            selections.append((None, sel["from"], _take(sel)))
    by_source: dict[str, dict[int, dict]] = {}
    for source in sorted({s for _, s, _ in selections}):
        ranges = [r for _, s, r in selections if s == source]
        needed = None if any(r is None for r in ranges) else set().union(*ranges)
        by_source[source] = _read_ranked(name, raw_dir / source, source, needed, source_tag(source), progress)
    files, rows = {}, {}
    for path, spec in outputs.items():
        if "from" in spec:
            questions = _pick(by_source[spec["from"]], _take(spec))
        else:
            pool = [q for sel in spec["corpus_of"] for q in _pick(by_source[sel["from"]], _take(sel))]
            questions = corpus_from_questions(pool)
            if not questions:
                raise UserError(f"{path}: the questions it pools carry no paragraphs")
        files[root / path], rows[path] = questions, len(questions)
    write_atomic(files)
    return rows


def _pick(ranked: dict[int, dict], ranks: range | None) -> list[dict]:
    return [ranked[r] for r in sorted(ranked) if ranks is None or r in ranks]


def _read_ranked(name, path: Path, hub_path: str, needed: set | None, source: str, progress) -> dict[int, dict]:
    """{rank: question} for the lines of `path` whose rank is `needed` (None: every line)."""
    lines = _line_count(path)
    order = sorted(range(lines), key=lambda i: hashlib.sha256(f"{hub_path}:{i}".encode()).digest())
    rank_of = {line: rank for rank, line in enumerate(order) if needed is None or rank in needed}
    split = Path(hub_path).stem  # FlashRAG names files by split: train, dev, test
    out, i = {}, 0
    task = (
        progress.add_task(f"convert: {hub_path}", total=max(path.stat().st_size // MB, 1), unit="MB")
        if progress
        else None
    )
    read = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            read += len(line)
            if progress is not None and lineno % 1000 == 0:
                progress.update(task, completed=read // MB)
            if not line.strip():
                continue
            if i in rank_of:
                where = f"{path}:{lineno}"
                out[rank_of[i]] = _question(parse_line(line, where), name, split, source, where)
            i += 1
    if progress is not None:
        progress.update(task, completed=max(path.stat().st_size // MB, 1))
    return out


def _line_count(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _question(raw: dict, dataset: str, split: str, source: str, where: str) -> dict:
    row, meta = dict(raw), dict(raw.get("metadata") or {})
    if "id" in raw:
        meta["orig_id"] = str(raw["id"])
        row["id"] = f"{dataset}-{raw['id']}"
    meta.update(dataset=dataset, split=split, source=source)
    row["metadata"] = meta
    question = convert_record(row, "flashrag", where)
    question["metadata"].pop("context", None)  # `paragraphs` holds the same titles and sentences
    return question


def _passages(outputs: dict, raw_dir: Path, root: Path, progress) -> dict[str, int]:
    """wiki-18: the zip's passages unzipped as they are, and a seeded sample of them, in one pass."""
    (zip_path,) = {s.get("unzip") or s.get("sample_of") for s in outputs.values()}
    unzip_to = next((p for p, s in outputs.items() if "unzip" in s), None)
    samples = {p: s["count"] for p, s in outputs.items() if "sample_of" in s}
    rng, k = random.Random(0), max(samples.values(), default=0)
    reservoir, n = [], 0
    tmp = root / f"{unzip_to}.tmp-{os.getpid()}" if unzip_to else None
    try:
        with zipfile.ZipFile(raw_dir / zip_path) as z:
            members = [m for m in z.infolist() if m.filename.endswith(".jsonl")]
            if not members:
                raise UserError(f"{zip_path}: no .jsonl file in the zip")
            member = max(members, key=lambda m: m.file_size)
            task = (
                progress.add_task(f"unzip: {member.filename}", total=max(member.file_size // MB, 1), unit="MB")
                if progress
                else None
            )
            if tmp:
                tmp.parent.mkdir(parents=True, exist_ok=True)
            with z.open(member) as src, open(tmp or os.devnull, "wb") as dst:
                done = 0
                for line in src:
                    dst.write(line)
                    done += len(line)
                    if line.strip():
                        n += 1  # reservoir sampling: each passage kept with probability k/n
                        if len(reservoir) < k:
                            reservoir.append(line)
                        elif (j := rng.randrange(n)) < k:
                            reservoir[j] = line
                    if progress is not None and n % 100_000 == 0:
                        progress.update(task, completed=done // MB)
        rows = {}
        for path, count in samples.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            part.write_bytes(b"".join(line.rstrip(b"\r\n") + b"\n" for line in reservoir[:count]))
            os.replace(part, target)
            rows[path] = min(count, len(reservoir))
        if tmp:
            os.replace(tmp, root / unzip_to)
            rows[unzip_to] = n
        return rows
    except zipfile.BadZipFile as e:
        raise UserError(f"{zip_path}: not a readable zip ({e})") from None
    finally:
        if tmp:
            tmp.unlink(missing_ok=True)
