"""Retrieval quality on QA sets with gold passages: passage recall@k and answer recall@k.

A question's gold passages follow r3rag.core.gold_docs, the rule every stage uses: corpus ids in
`metadata.supporting_docs` (the synthetic world), else titles in `metadata.supporting_titles`, plus
here the titles of `metadata.paragraphs` entries flagged `is_supporting` (raw HotpotQA, MuSiQue,
2Wiki files; `r3rag import` already folds those into supporting_titles). recall@k = the share of a
question's gold documents found in its top k, averaged over the questions that have gold documents
in the corpus; answer_recall@k = the share of questions
with a normalised gold answer, as whole words, inside a normalised top-k passage (title and text,
as FlashRAG's `contents`).

With `hop_queries` (one list of queries per question, e.g. a model's or an oracle's searches) the
same figures are also computed for the union of the hops' top-k lists, under `hops_` keys.

Usage:
    m = retrieval_metrics(retriever, questions, ks=(1, 5, 10))
    m["recall@5"], m["answer_recall@5"], m["n_gold"]
"""

from __future__ import annotations

from pathlib import Path

from r3rag.core.gold_docs import GoldDocs, doc_key, gold_docs
from r3rag.core.metrics import normalize_answer
from r3rag.core.protocol import Hit
from r3rag.util.errors import UserError
from r3rag.util.jsonl import iter_numbered, unique_by_id


def load_hop_queries(path: str | Path) -> dict[str, list[str]]:
    """{question id: [query, ...]} from JSONL rows `{"id", "queries"}`; errors name file:line."""
    rows = unique_by_id(
        (f"{path}:{n}", _hops_row(row, f"{path}:{n}")) for n, row in iter_numbered(path, required=("id", "queries"))
    )
    if not rows:
        raise UserError(f"{path}: file is empty")
    return {r["id"]: r["queries"] for r in rows}


def _hops_row(row: dict, where: str) -> dict:
    queries = row["queries"]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise UserError(f"{where}: field 'queries' must be a list of strings")
    return {"id": str(row["id"]), "queries": queries}


def question_gold(question: dict) -> GoldDocs | None:
    """`gold_docs(question)`, with flagged paragraphs' titles added to title gold: raw data files may flag a
    supporting paragraph without listing its title, and recall should count it as `r3rag import` would."""
    gold = gold_docs(question)
    if gold is not None and gold.by == "id":
        return gold
    names = list(gold.names) if gold else []
    meta = question.get("metadata") or {}
    names += [p["title"] for p in meta.get("paragraphs") or [] if p.get("is_supporting") and p["title"] not in names]
    return GoldDocs("title", tuple(names)) if names else None


def gold_keys(question: dict, corpus_keys: dict[str, set[str]]) -> tuple[str, set[str]]:
    """(how gold is named, the question's gold keys that name a corpus document); no gold = ("title", set())."""
    gold = question_gold(question)
    return ("title", set()) if gold is None else (gold.by, set(gold.keys) & corpus_keys[gold.by])


def _corpus_keys(docs) -> dict[str, set[str]]:
    """Every document's id and title keys, in one pass over the corpus (a DocStore reads each row from disk)."""
    keys = {"id": set(), "title": set()}
    for d in docs:
        keys["id"].add(doc_key(d, "id"))
        keys["title"].add(doc_key(d, "title"))
    return keys


def _hit_key(hit: Hit, by: str) -> str:
    return doc_key({"id": hit.doc_id, "title": hit.title}, by)


def retrieval_metrics(
    retriever,
    questions: list[dict],
    ks=(1, 3, 5, 10),
    hop_queries: list[list[str]] | None = None,
    batch_size: int = 256,
) -> dict:
    kmax = max(ks)
    corpus_keys = _corpus_keys(retriever.docs)
    golds = [gold_keys(q, corpus_keys) for q in questions]
    answers = [[normalize_answer(a) for a in q.get("golden_answers") or []] for q in questions]
    ranked = _search([q["question"] for q in questions], retriever, kmax, batch_size)
    out = {"n": len(questions), "n_gold": sum(1 for _, keys in golds if keys)}
    out |= _figures(ranked, golds, answers, ks, prefix="")
    if hop_queries is not None:
        if len(hop_queries) != len(questions):
            raise ValueError(f"hop_queries has {len(hop_queries)} lists for {len(questions)} questions")
        flat = [q for qs in hop_queries for q in qs]
        hits = iter(_search(flat, retriever, kmax, batch_size))
        per_question = [[next(hits) for _ in qs] for qs in hop_queries]
        out |= _figures_union(per_question, golds, answers, ks)
    return out


def _search(queries: list[str], retriever, k: int, batch_size: int) -> list[list[Hit]]:
    out = []
    for start in range(0, len(queries), batch_size):
        out.extend(retriever.search(queries[start : start + batch_size], k))
    return out


def _figures(ranked: list[list[Hit]], golds, answers, ks, prefix: str) -> dict:
    return _figures_union([[r] for r in ranked], golds, answers, ks, prefix)


def _figures_union(per_question: list[list[list[Hit]]], golds, answers, ks, prefix: str = "hops_") -> dict:
    """Figures where a question's top k is the union of the top k of each of its hit lists."""
    out = {}
    for k in ks:
        rec, ans = [], []
        for lists, (by, gold), golds_a in zip(per_question, golds, answers):
            top = [h for hits in lists for h in hits[:k]]
            if gold:
                rec.append(len(gold & {_hit_key(h, by) for h in top}) / len(gold))
            texts = [normalize_answer(f"{h.title} {h.text}") for h in top]
            ans.append(float(any(a and _contains(t, a) for a in golds_a for t in texts)))
        out[f"{prefix}recall@{k}"] = sum(rec) / len(rec) if rec else 0.0
        out[f"{prefix}answer_recall@{k}"] = sum(ans) / len(ans) if ans else 0.0
    return out


def _contains(text: str, answer: str) -> bool:
    # Whole words only, so "1" does not match inside "1912".
    return f" {answer} " in f" {text} "
