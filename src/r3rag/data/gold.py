"""The gold documents of a question, served like a retriever: the oracle reader's context.

An oracle reader (the ceiling of single-shot RAG) answers from the documents the question needs
instead of from a search. `GoldRetriever` looks a question's text up and returns those documents,
so the rollout loop's `rag` mode (documents in a `qa` reader's prompt) runs it unchanged, in
synthesis (reader training data) as in evaluation. Gold documents are `metadata.supporting_docs`
(corpus ids: the synthetic world) or else `metadata.supporting_titles` (real data: the first
corpus document with each title), matched as r3rag.core.gold_docs matches them. They come in an order shuffled per question id, so a reader
learns to find the answering document by its names, not by its place.

Usage::

    gold = GoldRetriever(corpus_docs, questions)
    hits = gold.search([q["question"] for q in questions], k=3)   # every gold document; k is ignored
"""

from __future__ import annotations

import random

from r3rag.core.gold_docs import doc_key, require_gold_docs
from r3rag.core.protocol import Hit
from r3rag.util.errors import UserError


class GoldRetriever:
    """Question text -> that question's gold documents, as `Hit`s (score 1.0)."""

    def __init__(self, docs: list[dict], questions: list[dict]):
        tables: dict[str, dict[str, dict]] = {"id": {}, "title": {}}
        for d in docs:
            for by, table in tables.items():
                table.setdefault(doc_key(d, by), d)  # a title shared by several documents: the first
        self.gold: dict[str, list[Hit]] = {}
        for q in questions:
            hits = _gold_hits(q, tables)
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


def _gold_hits(q: dict, tables: dict[str, dict[str, dict]]) -> list[Hit]:
    gold = require_gold_docs(q, "the gold reader")
    docs = []
    for name in gold.names:
        doc = tables[gold.by].get(gold.name_key(name))
        if doc is None:
            raise UserError(f"question {q.get('id')!r}: gold document {name!r} is not in the corpus")
        docs.append(doc)
    random.Random(str(q["id"])).shuffle(docs)  # the chain's order would tell the reader which one answers
    return [Hit(str(d["id"]), 1.0, d["title"], d["text"]) for d in docs]
