"""The gold documents of a question, served like a retriever: the oracle reader's context.

An oracle reader (the ceiling of single-shot RAG) answers from the documents the question needs
instead of from a search. `GoldRetriever` looks a question's text up and returns those documents,
so the rollout loop's `rag` mode (documents in a `qa` reader's prompt) runs it unchanged, in
synthesis (reader training data) as in evaluation. Gold documents are `metadata.supporting_docs`
(corpus ids: the synthetic world) or else `metadata.supporting_titles` (real data: the first
corpus document with each title). They come in an order shuffled per question id, so a reader
learns to find the answering document by its names, not by its place.

Usage::

    gold = GoldRetriever(corpus_docs, questions)
    hits = gold.search([q["question"] for q in questions], k=3)   # every gold document; k is ignored
"""

from __future__ import annotations

import random

from r3rag.errors import UserError
from r3rag.protocol import Hit


def gold_doc_keys(question: dict) -> tuple[str, list[str]]:
    """("id", doc ids) or ("title", titles): how the question names its gold documents."""
    meta = question.get("metadata") or {}
    if meta.get("supporting_docs"):
        return "id", list(meta["supporting_docs"])
    if meta.get("supporting_titles"):
        return "title", list(meta["supporting_titles"])
    raise UserError(
        f"question {question.get('id')!r}: no gold documents (metadata.supporting_docs or "
        "supporting_titles); the gold reader needs them"
    )


class GoldRetriever:
    """Question text -> that question's gold documents, as `Hit`s (score 1.0)."""

    def __init__(self, docs: list[dict], questions: list[dict]):
        by_id = {str(d["id"]): d for d in docs}
        by_title: dict[str, dict] = {}
        for d in docs:
            by_title.setdefault(_norm(d["title"]), d)
        self.gold: dict[str, list[Hit]] = {}
        for q in questions:
            hits = _gold_hits(q, by_id, by_title)
            if self.gold.get(q["question"], hits) != hits:
                raise UserError(
                    f"question {q.get('id')!r}: another question has the same text but other gold "
                    "documents; the gold reader finds documents by question text"
                )
            self.gold[q["question"]] = hits

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        missing = [q for q in queries if q not in self.gold]
        if missing:
            raise UserError(f"gold documents: no question with the text {missing[0]!r}")
        return [list(self.gold[q]) for q in queries]


def _gold_hits(q: dict, by_id: dict[str, dict], by_title: dict[str, dict]) -> list[Hit]:
    kind, keys = gold_doc_keys(q)
    table = by_id if kind == "id" else by_title
    docs = []
    for key in keys:
        doc = table.get(str(key) if kind == "id" else _norm(key))
        if doc is None:
            raise UserError(f"question {q.get('id')!r}: gold document {key!r} is not in the corpus")
        docs.append(doc)
    random.Random(str(q["id"])).shuffle(docs)  # the chain's order would tell the reader which one answers
    return [Hit(str(d["id"]), 1.0, d["title"], d["text"]) for d in docs]


def _norm(title: str) -> str:
    return " ".join(title.lower().split())
