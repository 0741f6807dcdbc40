"""`r3rag world`: generate the embedded synthetic world (corpus + 2/3-hop questions).

Writes `corpus.jsonl` (FlashRAG style: id, title, text, contents), `train.jsonl` and
`test.jsonl` (id, question, golden_answers, metadata with the gold hop chain) and
`vocab.txt` (every word any world can use, for the word-level tokenizer). Test questions
are about entities (people, companies, universities) that no training question mentions.

It also measures how often the question text alone retrieves the documents a question
needs (BM25, top-k): questions must need iterative retrieval, so this should be near 0.

Usage:

    r3rag world --set seed=7
"""

from __future__ import annotations

from dataclasses import dataclass

from r3rag.data.world import WorldConfig, generate_world, world_vocabulary
from r3rag.jsonl import write_jsonl
from r3rag.stages.common import Context

INPUTS: dict[str, str] = {}


@dataclass
class Config(WorldConfig):
    name: str = "default"
    probe_top_k: int = 3  # k for the question-only retrieval probe


def run(cfg: Config, ctx: Context):
    writer = ctx.writer("world", cfg, {}, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    world_cfg = WorldConfig(**{k: getattr(cfg, k) for k in WorldConfig.__dataclass_fields__})
    with writer:
        world = generate_world(world_cfg)
        write_jsonl(writer.dir / "corpus.jsonl", world.docs)
        write_jsonl(writer.dir / "train.jsonl", world.train)
        write_jsonl(writer.dir / "test.jsonl", world.test)
        (writer.dir / "vocab.txt").write_text("\n".join(world_vocabulary(world_cfg)) + "\n")
        writer.metrics.update({
            "docs": len(world.docs), "train_questions": len(world.train), "test_questions": len(world.test),
            "hops": _hop_counts(world.test),
            **question_only_probe(world.docs, world.test, cfg.probe_top_k),
        })
    return ctx.done(writer)


def _hop_counts(questions: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for q in questions:
        k = str(q["metadata"]["hops"])
        counts[k] = counts.get(k, 0) + 1
    return counts


def question_only_probe(docs: list[dict], questions: list[dict], k: int) -> dict:
    """Fraction of questions whose question text alone retrieves (a) every needed doc, (b) any bridge doc."""
    from r3rag.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever.build(docs)
    hits = retriever.search([q["question"] for q in questions], k)
    all_found = bridge_found = 0
    for q, h in zip(questions, hits):
        got = {x.doc_id for x in h}
        needed = q["metadata"]["supporting_docs"]
        all_found += set(needed) <= got
        bridge_found += bool(set(needed[1:]) & got)
    n = max(len(questions), 1)
    return {f"question_only_all_docs@{k}": round(all_found / n, 4),
            f"question_only_bridge_doc@{k}": round(bridge_found / n, 4)}
