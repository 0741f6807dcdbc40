"""Relevance of each search step's documents, for the R3-RAG process reward: one score in
[0, 1] per search step of each trajectory.

- `gold`: 1 if the step retrieved a gold supporting document no earlier step had, else 0
  (needs `metadata.supporting_docs` or `supporting_titles` on the questions; matched by
  r3rag.core.gold_docs, as eval's recall and the oracle teacher match them).
- `embedding`: max over the step's documents of cos(question, document), clipped at 0, with
  a Hugging Face encoder (default: the packaged all-MiniLM-L6-v2, offline).
- `judge`: an LLM judge over an OpenAI-compatible endpoint scores question, step and the
  first `doc_chars` characters of each document, replying `Relevance: x.xx` (R3-RAG's
  `calculate_doc_score`, clamped to [0, 1]). A failed request (after the client's retries)
  or a reply without a score raises `JudgeError`: never a silent 0.

Usage:
    rel = make_relevance(RewardSettings(relevance="embedding"))
    rel(trajectories, examples) -> [[0.71, 0.33], [], ...]
"""

from __future__ import annotations

import re

import numpy as np

from r3rag.core.env import Trajectory
from r3rag.core.gold_docs import require_gold_docs
from r3rag.evaluation.judge import JudgeError

RELEVANCE_PROMPT = (
    "You are judging a retrieval step of a system that answers a question by searching step by step.\n"
    "Question: {question}\n"
    "The step (its reasoning and search query): {step}\n"
    "Retrieved documents:\n{docs}\n"
    "How relevant and useful are these documents for answering the question, given the step? Score 0 if they "
    "are irrelevant or the step's reasoning is illogical or contradicts them; a score of 0.6 or more passes. "
    "Explain briefly, then end with exactly one line: `Relevance: x.xx` (a number between 0 and 1)."
)
_SCORE = re.compile(r"relevance\s*:\s*\**\s*([01](?:\.\d+)?|\.\d+)", re.I)


def parse_relevance(reply: str) -> float | None:
    """The last `Relevance: x.xx` in the reply, clamped to [0, 1]; None when there is none."""
    found = _SCORE.findall(reply)
    return min(1.0, max(0.0, float(found[-1]))) if found else None


def make_relevance(settings, client=None):
    match settings.relevance:
        case "gold":
            return lambda trajs, examples: [gold_relevance(t, ex) for t, ex in zip(trajs, examples)]
        case "embedding":
            return EmbeddingRelevance(settings.encoder, settings.doc_chars)
        case "judge":
            return JudgeRelevance(client(), settings.doc_chars)


class EmbeddingRelevance:
    def __init__(self, encoder: str = "", doc_chars: int = 512, batch_size: int = 64):
        from r3rag.retrieval.dense import Encoder

        self.encoder, self.doc_chars, self.batch_size = Encoder(encoder), doc_chars, batch_size

    def __call__(self, trajs: list[Trajectory], examples: list[dict]) -> list[list[float]]:
        # Every distinct text is embedded once per batch (a group shares its question and many documents).
        texts = sorted(
            {t.question for t in trajs} | {self._doc(d) for t in trajs for docs in t.documents for d in docs}
        )
        if not texts:
            return [[] for _ in trajs]
        emb = dict(zip(texts, self.encoder.encode(texts, self.batch_size, normalize=True)))
        out = []
        for t in trajs:
            q = emb[t.question]
            out.append(
                [
                    max(0.0, max(float(np.dot(q, emb[self._doc(d)])) for d in docs)) if docs else 0.0
                    for docs in t.documents
                ]
            )
        return out

    def _doc(self, d: dict) -> str:
        return f"{d['title']} {d['text']}"[: self.doc_chars or None]


class JudgeRelevance:
    def __init__(self, client, doc_chars: int = 512):
        self.client, self.doc_chars = client, doc_chars
        self.calls = 0

    def __call__(self, trajs: list[Trajectory], examples: list[dict]) -> list[list[float]]:
        asks, owners = [], []
        for i, t in enumerate(trajs):
            model_turns = [x.text for x in t.turns if x.role == "model"]
            search_turns = [txt for txt, s in zip(model_turns, t.steps) if s["kind"] == "search"]
            for step_text, docs in zip(search_turns, t.documents):  # the last search may have no documents
                asks.append([{"role": "user", "content": self.prompt(t.question, step_text, docs)}])
                owners.append(i)
        results = self.client.chat_many(asks, temperature=0.0) if asks else []
        self.calls += len(asks)
        out: list[list[float]] = [[] for _ in trajs]
        for i, r in zip(owners, results):
            if not r.ok:
                raise JudgeError(f"relevance judge endpoint {self.client.url}: {r.kind}: {r.error}")
            score = parse_relevance(r.text)
            if score is None:
                raise JudgeError(
                    f"relevance judge endpoint {self.client.url}: no 'Relevance: x.xx' in the reply {r.text[-200:]!r}"
                )
            out[i].append(score)
        return out

    def prompt(self, question: str, step: str, docs: list[dict]) -> str:
        text = "\n".join(
            f"Doc {j}(Title: {d['title']}) {d['text'][: self.doc_chars or None]}" for j, d in enumerate(docs, start=1)
        )
        return RELEVANCE_PROMPT.format(question=question, step=step.strip(), docs=text)


def gold_relevance(traj: Trajectory, example: dict) -> list[float]:
    """Per search step: 1 if it retrieved a gold supporting document that no earlier step had."""
    gold = require_gold_docs(example, "reward.relevance=gold", "use reward.relevance=embedding or judge")
    seen: set[str] = set()
    out = []
    for docs in traj.documents:
        new = gold.found(docs) - seen
        out.append(1.0 if new else 0.0)
        seen |= new
    return out
