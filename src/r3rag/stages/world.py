"""`r3rag world`: generate the embedded synthetic world (corpus + 2- to 4-hop questions).

Writes `corpus.jsonl` (FlashRAG style: id, title, text, contents), `train.jsonl`, `test.jsonl`
and, with `dev_clusters` > 0, `dev.jsonl` (id, question, golden_answers, metadata with the gold
hop chain) and `vocab.txt` (every word any world can use, for the word-level tokenizer). Dev and
test questions are about entities (people, companies, universities) that no training question
mentions, and dev shares none with test: settings are chosen on dev (`eval --set split=dev`),
test is scored once.

It also measures how often the question text alone retrieves the documents a question needs
(BM25, top `probe_top_k`): chain questions must need iterative retrieval, so this should be
near 0 for them; named questions (`named` > 0: every intermediate entity named, type `named`)
are the ones a single retrieval can answer, reported apart (`named_question_only_all_docs@k`).

`source: files` reads real questions and passages instead (see r3rag.data.real): question files
per split (`train`, `dev`, `test`; any format `r3rag import` reads) and `corpus` files, relative
to `data_root` (default `$R3RAG_DATA`, else data/fetched: `r3rag data fetch`),
`limits` questions per file and split. `pool` files are split by question instead (`pool_split`:
how many go to test and dev, the rest to train, ranked by a hash of `seed` and each id), so
questions from dev-only sets can train with no question in two splits. The same files are
written (plus `dev.jsonl`), so every later stage reads it like a world; the artifact id follows
the files' content, not where they are.

Usage:

    r3rag world --set seed=7
    r3rag world --set seed=1 --set dev_clusters=6 --set named=0.25   # a dev split, named questions
    r3rag world --config pipelines/real-smollm2.yaml     # source: files (the shared HotpotQA...)
    r3rag world --config pipelines/real-smollm2-rl.yaml  # a pool split 300 test / 80 dev / the rest train
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from r3rag.data.world import WorldConfig, generate_world, world_vocabulary
from r3rag.stages.common import Context, file_input
from r3rag.util.config import hashed_when_set, unhashed
from r3rag.util.errors import UserError
from r3rag.util.jsonl import write_jsonl

INPUTS: dict[str, str] = {}


@dataclass
class Config(WorldConfig):
    name: str = "default"  # the artifact's name: runs/world/<name>-<hash>
    probe_top_k: int = 3  # k for the question-only retrieval probe
    source: str = "synthetic"  # synthetic (generated) or files (real questions and passages)
    train: list[str] = field(default_factory=list)  # source=files: question files, relative to data_root
    dev: list[str] = field(default_factory=list)  # source=files: dev question files, less any in test ([] = none)
    test: list[str] = field(default_factory=list)  # source=files: test question files
    corpus: list[str] = field(default_factory=list)  # passage files (FlashRAG contents or id/title/text)
    limits: dict[str, int] = field(default_factory=dict)  # split (or pool) -> first N questions of each file (0 = all)
    pool: list[str] = hashed_when_set(default_factory=list, silent=True)  # source=files: split by question
    pool_split: dict[str, int] = hashed_when_set(default_factory=dict, silent=True)  # pool: test/dev sizes
    data_root: str = unhashed("")  # "" = $R3RAG_DATA, else data/fetched (the files are hashed, not their place)


def validate(cfg: Config) -> None:
    if cfg.source not in ("synthetic", "files"):
        raise UserError(f"world.source: expected synthetic or files, got {cfg.source!r}")
    bad = sorted(set(cfg.limits) - {"train", "dev", "test", "pool"})
    if bad:
        raise UserError(f"world.limits: unknown split {bad[0]!r} (expected train, dev, test or pool)")
    bad = sorted(set(cfg.pool_split) - {"dev", "test"})
    if bad:
        raise UserError(f"world.pool_split: unknown split {bad[0]!r} (expected test or dev; the rest is train)")
    if any(n < 0 for n in cfg.pool_split.values()):
        raise UserError(f"world.pool_split: sizes must be >= 0, got {dict(cfg.pool_split)}")
    if cfg.pool_split and not cfg.pool:
        raise UserError("world.pool_split: set without pool files to split")


def run(cfg: Config, ctx: Context):
    validate(cfg)
    if cfg.source == "files":
        return _run_files(cfg, ctx)
    writer = ctx.writer("world", cfg, {}, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    world_cfg = WorldConfig(**{k: getattr(cfg, k) for k in WorldConfig.__dataclass_fields__})
    with writer:
        world = generate_world(world_cfg)
        write_jsonl(writer.dir / "corpus.jsonl", world.docs)
        for split, questions in world.splits.items():
            if questions or split != "dev":  # no dev.jsonl without a dev split: eval on it then fails loudly
                write_jsonl(writer.dir / f"{split}.jsonl", questions)
        (writer.dir / "vocab.txt").write_text("\n".join(world_vocabulary(world_cfg)) + "\n")
        writer.metrics.update(
            {
                "docs": len(world.docs),
                **{f"{s}_questions": len(qs) for s, qs in world.splits.items()},
                "named_questions": {s: sum(_is_named(q) for q in qs) for s, qs in world.splits.items()},
                "hops": _hop_counts(world.test),
                **_probes(world.docs, world.test, cfg.probe_top_k),
            }
        )
    return ctx.done(writer)


def _hop_counts(questions: list[dict]) -> dict:
    counts: dict[str, int] = {}
    for q in questions:
        k = str(q["metadata"]["hops"])
        counts[k] = counts.get(k, 0) + 1
    return counts


def _is_named(q: dict) -> bool:
    return q["metadata"].get("type") == "named"


def _probes(docs: list[dict], questions: list[dict], k: int) -> dict:
    """The question-only probe for chain questions (the keys as before named questions existed)
    and, apart, for named ones."""
    chain = [q for q in questions if not _is_named(q)]
    named = [q for q in questions if _is_named(q)]
    out = question_only_probe(docs, chain, k)
    if named:
        out.update({f"named_{key}": v for key, v in question_only_probe(docs, named, k).items()})
    return out


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
    return {
        f"question_only_all_docs@{k}": round(all_found / n, 4),
        f"question_only_bridge_doc@{k}": round(bridge_found / n, 4),
    }


def _run_files(cfg: Config, ctx: Context):
    from r3rag.data.real import RealFiles, data_root, load_real, resolve_files

    files = RealFiles(
        train=cfg.train, dev=cfg.dev, test=cfg.test, corpus=cfg.corpus, limits=dict(cfg.limits),
        pool=cfg.pool, pool_split=dict(cfg.pool_split), seed=cfg.seed,
    )  # fmt: skip
    root = data_root(cfg.data_root)
    paths = resolve_files(files, root)
    inputs = {f"{split}:{i}": file_input(p) for split, ps in paths.items() for i, p in enumerate(ps)}
    writer = ctx.writer("world", cfg, inputs, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    data = load_real(files, root)
    with writer:
        write_jsonl(writer.dir / "corpus.jsonl", data.docs)
        for split, questions in data.splits.items():
            write_jsonl(writer.dir / f"{split}.jsonl", questions)
        writer.metrics.update(
            {
                "docs": len(data.docs),
                **{f"{s}_questions": len(qs) for s, qs in data.splits.items()},
                "datasets": {
                    s: dict(Counter(q["metadata"].get("dataset", "unknown") for q in qs))
                    for s, qs in data.splits.items()
                    if qs
                },
                "dropped_from_train": data.dropped_from_train,
                **({"pool": data.pool} if data.pool else {}),
                "gold_in_corpus": _gold_coverage(data.docs, [q for qs in data.splits.values() for q in qs]),
            }
        )
    return ctx.done(writer)


def _gold_coverage(docs: list[dict], questions: list[dict]) -> float | None:
    """Share of questions with supporting titles whose every gold title is a corpus title."""
    titles = {d["title"].strip().lower() for d in docs}
    gold = [q["metadata"]["supporting_titles"] for q in questions if q["metadata"].get("supporting_titles")]
    if not gold:
        return None
    return round(sum(all(t.strip().lower() in titles for t in g) for g in gold) / len(gold), 4)
