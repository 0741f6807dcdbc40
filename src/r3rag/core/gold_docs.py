"""Which documents are a question's gold documents: the one rule every caller uses.

A question names its gold (supporting) documents by corpus id (`metadata.supporting_docs`: the
synthetic world) or else by title (`metadata.supporting_titles`: HotpotQA, 2Wiki, MuSiQue as
`r3rag import` writes them). Ids win when both are present: an id names one document, a title
may name several. Titles compare after lower-casing and collapsing whitespace (`title_key`), so
"Gare du  Nord" in a question file finds the corpus document "gare du nord"; nothing else is
normalised (articles and punctuation tell Wikipedia titles apart: "The Who" is not "Who").

Used by the gold relevance reward (r3rag.rl.relevance), eval's gold-document recall
(r3rag.evaluation.predictions), the gold reader's retriever (r3rag.data.gold) and the oracle teacher's
check that it found the supporting titles (r3rag.synthesis.teachers) and retrieval recall (r3rag.retrieval.evaluate,
which also counts raw files' `is_supporting` paragraphs), so all of them agree on every document.

Usage:
    gold = gold_docs(question)            # None when the question names no gold documents
    gold.key(doc)                         # the gold key `doc` matches ("p12" / "gare du nord"), or None
    gold.found(documents)                 # the gold keys among retrieved documents
    gold.recall(documents)                # share of the gold documents among them
    gold.missing(documents)               # gold names (as the question spells them) not yet found
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from r3rag.util.errors import UserError


def title_key(title: str) -> str:
    """How titles compare: case and runs of whitespace do not count."""
    return " ".join(str(title).lower().split())


def doc_key(doc: dict, by: Literal["id", "title"]) -> str:
    """A document's key when gold documents are named `by` id or by title."""
    return str(doc["id"]) if by == "id" else title_key(doc["title"])


@dataclass(frozen=True)
class GoldDocs:
    by: Literal["id", "title"]
    names: tuple[str, ...]  # as the question spells them, in its order
    keys: frozenset[str] = field(init=False, repr=False)  # the names as `doc_key` writes them

    def __post_init__(self):
        object.__setattr__(self, "keys", frozenset(self.name_key(n) for n in self.names))

    def name_key(self, name: str) -> str:
        """A gold name as `doc_key` writes the key of the document it names."""
        return str(name) if self.by == "id" else title_key(name)

    def key(self, doc: dict) -> str | None:
        k = doc_key(doc, self.by)
        return k if k in self.keys else None

    def found(self, documents: Iterable[dict]) -> set[str]:
        return {k for k in (self.key(d) for d in documents) if k is not None}

    def recall(self, documents: Iterable[dict]) -> float:
        return len(self.found(documents)) / len(self.keys)

    def missing(self, documents: Iterable[dict]) -> list[str]:
        found = self.found(documents)
        return [n for n in self.names if self.name_key(n) not in found]


def gold_docs(question: dict) -> GoldDocs | None:
    """The question's gold documents, or None when its metadata names none."""
    meta = question.get("metadata") or {}
    if meta.get("supporting_docs"):
        return GoldDocs("id", tuple(str(d) for d in meta["supporting_docs"]))
    if meta.get("supporting_titles"):
        return GoldDocs("title", tuple(meta["supporting_titles"]))
    return None


def require_gold_docs(question: dict, needed_by: str, hint: str = "") -> GoldDocs:
    """`gold_docs`, or one line naming the question, what needed them and `hint`."""
    gold = gold_docs(question)
    if gold is None:
        raise UserError(
            f"{needed_by}: question {question.get('id')!r} has no gold documents (metadata.supporting_docs "
            f"or supporting_titles){f'; {hint}' if hint else ''}"
        )
    return gold


def flat(documents_per_step: Iterable[Iterable[dict]]) -> list[dict]:
    """A trajectory's retrieved documents over all its steps, in order."""
    return [d for docs in documents_per_step for d in docs]
