"""Relevance of each search step's documents, for the R3-RAG process reward: one score in
[0, 1] per search step of each trajectory.

- `gold`: 1 if the step retrieved a gold supporting document no earlier step had, else 0
  (needs `metadata.supporting_docs` or `supporting_titles` on the questions).
- `embedding`: max over the step's documents of cos(question, document), clipped at 0, with
  a Hugging Face encoder (default: the packaged all-MiniLM-L6-v2, offline).
- `judge`: an LLM judge over an OpenAI-compatible endpoint scores question, step and
  documents (R3-RAG's `calculate_doc_score`).

Usage:
    rel = make_relevance(RewardSettings(relevance="embedding"))
    rel(trajectories, examples) -> [[0.71, 0.33], [], ...]
"""

from __future__ import annotations

import numpy as np

from r3rag.env import Trajectory


def make_relevance(settings, judge=None):
    match settings.relevance:
        case "gold":
            from r3rag.rewards import gold_relevance

            return lambda trajs, examples: [gold_relevance(t, ex) for t, ex in zip(trajs, examples)]
        case "embedding":
            return EmbeddingRelevance(settings.encoder, settings.judge.max_doc_chars)
        case "judge":
            return JudgeRelevance(judge())


class EmbeddingRelevance:
    def __init__(self, encoder: str = "", max_doc_chars: int = 512, batch_size: int = 64):
        from r3rag.retrieval.dense import Encoder

        self.encoder, self.max_doc_chars, self.batch_size = Encoder(encoder), max_doc_chars, batch_size

    def __call__(self, trajs: list[Trajectory], examples: list[dict]) -> list[list[float]]:
        # Every distinct text is embedded once per batch (a group shares its question and many documents).
        texts = sorted({t.question for t in trajs} | {self._doc(d) for t in trajs for docs in t.documents for d in docs})
        if not texts:
            return [[] for _ in trajs]
        emb = dict(zip(texts, self.encoder.encode(texts, self.batch_size, normalize=True)))
        out = []
        for t in trajs:
            q = emb[t.question]
            out.append([max(0.0, max(float(np.dot(q, emb[self._doc(d)])) for d in docs)) if docs else 0.0
                        for docs in t.documents])
        return out

    def _doc(self, d: dict) -> str:
        return f"{d['title']} {d['text']}"[: self.max_doc_chars or None]


class JudgeRelevance:
    def __init__(self, judge):
        self.judge = judge

    def __call__(self, trajs: list[Trajectory], examples: list[dict]) -> list[list[float]]:
        items, owners = [], []
        for i, t in enumerate(trajs):
            model_turns = [x.text for x in t.turns if x.role == "model"]
            search_turns = [txt for txt, s in zip(model_turns, t.steps) if s["kind"] == "search"]
            for step_text, docs in zip(search_turns, t.documents):  # the last search may have no documents
                items.append((t.question, step_text, docs))
                owners.append(i)
        scores = self.judge.relevance(items) if items else []
        out: list[list[float]] = [[] for _ in trajs]
        for i, s in zip(owners, scores):
            out[i].append(s)
        return out
