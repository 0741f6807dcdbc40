"""Real questions and passages as a "world": train / dev / test splits and one corpus, from files.

The world stage's `source: files` reads question files (any format `r3rag import` reads:
HotpotQA, 2Wiki, MuSiQue, FlashRAG JSONL; the shared data's files) per split, and corpus files
(FlashRAG `contents` or `{id, title, text}`), relative to `data_root` (default: `$R3RAG_DATA`,
else the copy `r3rag data fetch` downloads: r3rag.data.shared).
The corpus is the corpus files plus every context paragraph the questions carry (so each
question's gold passages can be retrieved), one copy per title + text. A question that appears in an evaluation split (same id, or the same
normalised text) is dropped from `train`: training never sees a dev or test question.

`pool` files are split by question instead: each pooled question gets a rank from a hash of the
seed and its id, the first `pool_split["test"]` go to test, the next `pool_split["dev"]` to dev,
the rest to train (a question asked twice in the pool, by id or text, counts once). The ranks
depend on nothing else, so the test split is fixed by the seed before anything is tuned.

Usage:
    files = RealFiles(train=["hotpotqa/train_hipporag_sample.jsonl"], test=[...], corpus=[...])
    data = load_real(files, root)     # RealData(docs, splits={"train": [...], "test": [...]}, dropped)
    files = RealFiles(pool=[...], pool_split={"test": 300, "dev": 80}, corpus=[...])   # split by question
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from r3rag.data.corpus import load_corpus
from r3rag.data.importers import corpus_from_questions, import_questions
from r3rag.util.errors import UserError

SPLITS = ("train", "dev", "test")


@dataclass
class RealFiles:
    train: list[str] = field(default_factory=list)
    dev: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    corpus: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)  # split (or pool) -> questions per file (0 = all)
    pool: list[str] = field(default_factory=list)  # question files split by question (pool_split)
    pool_split: dict[str, int] = field(default_factory=dict)  # test / dev -> questions; the rest train
    seed: int = 0  # the pool's split


@dataclass
class RealData:
    docs: list[dict]
    splits: dict[str, list[dict]]
    dropped_from_train: int = 0
    pool: dict[str, int] = field(default_factory=dict)  # pooled questions per split, and duplicates dropped


def data_root(configured: str) -> Path:
    """`configured`, else the data root (`$R3RAG_DATA`, else the fetched copy)."""
    from r3rag.data.shared import shared_data

    root = Path(configured).expanduser() if configured else shared_data()
    if root is None or not root.is_dir():
        where = configured or "$R3RAG_DATA or data/fetched"
        raise UserError(
            f"world.data_root: no data directory ({where}): fetch the real QA sets with `make data` "
            "(r3rag data fetch), or point R3RAG_DATA at a local copy"
        )
    return root


def resolve_files(files: RealFiles, root: Path) -> dict[str, list[Path]]:
    """Every file by split (and "corpus"), checked to exist; one line naming the first missing one."""
    out = {}
    for split in (*SPLITS, "pool", "corpus"):
        paths = [root / f for f in getattr(files, split)]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            fetched = (root / "flashrag.lock.json").is_file()  # a copy `r3rag data fetch` wrote
            hint = f" (r3rag data fetch {missing[0].relative_to(root).parts[0]} writes it)" if fetched else ""
            raise UserError(f"world.{split}: file not found: {missing[0]}{hint}")
        out[split] = paths
    if not out["train"] and not out["test"] and not out["pool"]:
        raise UserError("world: source=files needs question files in train, test or pool")
    return out


def load_real(files: RealFiles, root: Path) -> RealData:
    paths = resolve_files(files, root)
    splits = {s: _questions(paths[s], files.limits.get(s, 0)) for s in SPLITS}
    pooled, pool_counts = _split_pool(files, paths["pool"])
    for split, questions in pooled.items():
        splits[split] += _without(questions, splits[split])
    # Dev shares no question with test (so dev can be the test file's next questions: the same
    # file with a larger limit), and train none with either.
    splits["dev"] = _without(splits["dev"], splits["test"])
    train = _without(splits["train"], splits["dev"] + splits["test"])
    dropped = len(splits["train"]) - len(train)
    splits["train"] = train
    docs = _corpus(paths["corpus"], [q for qs in splits.values() for q in qs])
    return RealData(docs, splits, dropped, pool_counts)


def _split_pool(files: RealFiles, paths: list[Path]) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """The pool's questions by split (test, dev, then train), ranked by a hash of seed and id."""
    if not paths:
        return {}, {}
    questions, duplicates = _unique(
        [q for p in paths for q in import_questions(p, "auto", files.limits.get("pool", 0))[0]]
    )
    n_test, n_dev = files.pool_split.get("test", 0), files.pool_split.get("dev", 0)
    if n_test + n_dev > len(questions):
        raise UserError(f"world.pool_split: test {n_test} + dev {n_dev} questions asked of a pool of {len(questions)}")
    ranked = sorted(questions, key=lambda q: hashlib.sha256(f"{files.seed}\0{q['id']}".encode()).hexdigest())
    out = {"test": ranked[:n_test], "dev": ranked[n_test : n_test + n_dev], "train": ranked[n_test + n_dev :]}
    return out, {**{s: len(qs) for s, qs in out.items()}, "duplicates": duplicates}


def _unique(questions: list[dict]) -> tuple[list[dict], int]:
    """The first of each question (by id or normalised text), and how many repeats were dropped."""
    out, ids, texts = [], set(), set()
    for q in questions:
        if q["id"] in ids or _norm(q["question"]) in texts:
            continue
        ids.add(q["id"])
        texts.add(_norm(q["question"]))
        out.append(q)
    return out, len(questions) - len(out)


def _without(questions: list[dict], held_out: list[dict]) -> list[dict]:
    """`questions` minus any that `held_out` has, by id or by normalised text."""
    seen_ids, seen_text = {q["id"] for q in held_out}, {_norm(q["question"]) for q in held_out}
    return [q for q in questions if q["id"] not in seen_ids and _norm(q["question"]) not in seen_text]


def _questions(paths: list[Path], limit: int) -> list[dict]:
    out, ids = [], set()
    for path in paths:
        for q in import_questions(path, "auto", limit)[0]:
            if q["id"] in ids:
                raise UserError(f"{path}: question id {q['id']!r} also appears in an earlier file of the split")
            ids.add(q["id"])
            out.append(q)
    return out


def _corpus(paths: list[Path], questions: list[dict]) -> list[dict]:
    """Corpus files, then the questions' own paragraphs; one document per title + text."""
    docs, seen_keys, seen_ids = [], set(), set()
    for doc in [d for p in paths for d in load_corpus(p)] + corpus_from_questions(questions):
        key = (doc["title"].strip(), doc["text"].strip())
        if key in seen_keys or not key[1]:
            continue
        if doc["id"] in seen_ids:
            raise UserError(f"world.corpus: document id {doc['id']!r} appears twice with different text")
        seen_keys.add(key)
        seen_ids.add(doc["id"])
        docs.append({"id": doc["id"], "title": doc["title"], "text": doc["text"]})
    return docs


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()
