"""`r3rag synthesize`: teacher trajectories for the SFT cold start.

Runs the teacher through the rollout loop with the real index; keeps a trajectory only
if it is well formed, correct and retrieved every needed document. Accepted go to
`trajectories.jsonl`, rejected (with their reason) to `rejected.jsonl`.

Synthetic worlds only: `extra_worlds: N` adds questions from N freshly generated worlds
(same world config, derived seeds, each searched through its own BM25 index built with
the index artifact's settings). Facts then differ from world to world, so a model cannot
memorise them and must learn to read what it retrieves. Questions that mention an entity
of the evaluation world's test split are dropped, so test entities stay unseen.

`retriever: http://host:port` searches the evaluation world through a retrieval server
(`r3rag serve-retriever`) instead of the index artifact; `extra_worlds` still needs the
index artifact, whose BM25 settings it reuses.

Usage:

    r3rag synthesize --set teacher=oracle --set top_k=3
    r3rag synthesize --set extra_worlds=50 --set extra_questions_per_world=400
    r3rag synthesize --set retriever=http://127.0.0.1:8000 --set index=
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass

from r3rag.env import EnvConfig, run_rollouts
from r3rag.errors import UserError
from r3rag.jsonl import read_jsonl, write_jsonl
from r3rag.protocol import Protocol
from r3rag.retrieval import is_url, open_retriever
from r3rag.stages.common import Context, resolve_inputs
from r3rag.teachers import oracle_generator, verify_oracle

INPUTS = {"world": "world", "index": "index"}


@dataclass
class Config:
    name: str = "default"
    world: str = "world:latest"
    index: str = "index:latest"
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    split: str = "train"
    limit: int = 0  # 0 = every question of the split
    extra_worlds: int = 0
    extra_questions_per_world: int = 400
    extra_world_clusters: int = 10  # size of each extra world; 0 = same as the evaluation world
    teacher: str = "oracle"
    top_k: int = 3
    max_turns: int = 6
    template: str = "search-r1"
    doc_style: str = "search-r1"
    batch_size: int = 1024
    seed: int = 0


def run(cfg: Config, ctx: Context):
    if cfg.teacher != "oracle":
        raise UserError(f"synthesize.teacher: unknown teacher {cfg.teacher!r} (available: oracle)")
    if cfg.extra_worlds and not cfg.index:
        raise UserError("synthesize.extra_worlds: needs the index artifact (its bm25 settings are reused per "
                        "world); set index")
    remote = is_url(cfg.retriever) and not cfg.extra_worlds  # the index is then not used at all
    inputs = resolve_inputs(cfg, {k: v for k, v in INPUTS.items() if not (remote and k == "index")}, ctx)
    writer = ctx.writer("synthesize", cfg, inputs, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    world_dir = inputs["world"].path
    questions = read_jsonl(world_dir / f"{cfg.split}.jsonl", required=("id", "question", "golden_answers"))
    questions = questions[: cfg.limit] if cfg.limit else questions
    sources = [("world", questions, open_retriever(cfg.retriever, inputs.get("index")))]
    if cfg.extra_worlds:
        sources += list(_extra_worlds(cfg, inputs))
    protocol = Protocol(template=cfg.template, doc_style=cfg.doc_style)
    env_cfg = EnvConfig(top_k=cfg.top_k, max_turns=cfg.max_turns)
    accepted, rejected, reasons = [], [], Counter()
    with writer, ctx.progress() as progress:
        task = progress.add_task("synthesize", total=sum(len(qs) for _, qs, _ in sources))
        for source, qs, retriever in sources:
            for lo in range(0, len(qs), cfg.batch_size):
                batch = qs[lo: lo + cfg.batch_size]
                trajs = run_rollouts(batch, oracle_generator(batch, protocol), retriever, protocol, env_cfg)
                for traj, q in zip(trajs, batch):
                    ok, reason = verify_oracle(traj, q)
                    row = {**traj.to_json(), "golden_answers": q["golden_answers"],
                           "metadata": q.get("metadata", {}), "source": source}
                    (accepted if ok else rejected).append(row if ok else {**row, "reject_reason": reason})
                    reasons[reason] += 1
                progress.advance(task, len(batch))
        if not accepted:
            raise UserError("synthesize: the teacher produced no accepted trajectory (see rejected.jsonl)")
        random.Random(cfg.seed).shuffle(accepted)
        write_jsonl(writer.dir / "trajectories.jsonl", accepted)
        write_jsonl(writer.dir / "rejected.jsonl", rejected)
        (writer.dir / "protocol.json").write_text(json.dumps({"template": cfg.template, "doc_style": cfg.doc_style}))
        writer.metrics.update(_stats(accepted, rejected, reasons, len(sources) - 1))
    return ctx.done(writer)


def _stats(accepted: list[dict], rejected: list[dict], reasons: Counter, n_extra: int) -> dict:
    total = len(accepted) + len(rejected)
    searches = [len(r["retrieved"]) for r in accepted]
    return {"questions": total, "accepted": len(accepted), "rejected": len(rejected),
            "acceptance_rate": round(len(accepted) / total, 4), "reasons": dict(reasons),
            "extra_worlds": n_extra, "from_eval_world": sum(r["source"] == "world" for r in accepted),
            "mean_searches": round(sum(searches) / len(searches), 3)}


def _extra_worlds(cfg: Config, inputs):
    """(source, questions, retriever) for freshly generated worlds, test entities excluded."""
    from r3rag.data.world import WorldConfig, generate_world
    from r3rag.retrieval.bm25 import BM25Retriever

    world_cfg = inputs["world"].manifest["config"]
    base = WorldConfig(**{k: world_cfg[k] for k in WorldConfig.__dataclass_fields__ if k in world_cfg})
    index_settings = json.loads((inputs["index"].path / "index" / "settings.json").read_text())
    if index_settings["backend"] != "bm25":
        raise UserError("synthesize.extra_worlds: needs a bm25 index (its settings are reused per world)")
    held_out = _chain_names(read_jsonl(inputs["world"].path / "test.jsonl"))
    rng = random.Random(cfg.seed)
    for i in range(cfg.extra_worlds):
        seed = base.seed * 100_003 + 7_919 * (i + 1)  # disjoint from the evaluation world's seed
        size = {"n_clusters": cfg.extra_world_clusters, "test_clusters": 0} if cfg.extra_world_clusters else {}
        world = generate_world(WorldConfig(**{**base.__dict__, "seed": seed, **size}))
        pool = [q for q in world.train + world.test if not (_chain_names([q]) & held_out)]
        qs = rng.sample(pool, min(cfg.extra_questions_per_world, len(pool)))
        for q in qs:
            q["id"] = f"w{i}-{q['id']}"
        retriever = BM25Retriever.build(world.docs, stopwords=index_settings["stopwords"],
                                        stemmer=index_settings["stemmer"], k1=index_settings["k1"],
                                        b=index_settings["b"], method=index_settings["method"])
        yield f"extra{i}", qs, retriever


def _chain_names(questions: list[dict]) -> set[str]:
    """People, companies and universities a question's chain passes through. These names
    have two words; cities, countries and years (one word) are shared geography."""
    names = set()
    for q in questions:
        chain = q.get("metadata", {}).get("chain", [])
        if chain:
            names.add(" ".join(chain[0]["fact"].split()[:2]))  # the subject
        names.update(hop["value"] for hop in chain)
    return {n for n in names if len(n.split()) == 2}
