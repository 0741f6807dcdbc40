"""`r3rag synthesize`: teacher trajectories for the SFT cold start.

Runs the teacher through the rollout loop with the real index; keeps a trajectory only
if it is well formed, correct and retrieved every needed document. Accepted go to
`trajectories.jsonl`, rejected (with their reason) to `rejected.jsonl`.

Usage:
    r3rag synthesize --set teacher=oracle --set top_k=3
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from r3rag.env import EnvConfig, run_rollouts
from r3rag.errors import UserError
from r3rag.jsonl import read_jsonl, write_jsonl
from r3rag.protocol import Protocol
from r3rag.retrieval import load_retriever
from r3rag.stages.common import Context, resolve_inputs
from r3rag.teachers import oracle_generator, verify_oracle

INPUTS = {"world": "world", "index": "index"}


@dataclass
class Config:
    name: str = "default"
    world: str = "world:latest"
    index: str = "index:latest"
    split: str = "train"
    limit: int = 0  # 0 = every question of the split
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
    inputs = resolve_inputs(cfg, INPUTS, ctx)
    writer = ctx.writer("synthesize", cfg, inputs, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    questions = read_jsonl(inputs["world"].path / f"{cfg.split}.jsonl", required=("id", "question", "golden_answers"))
    if cfg.limit:
        questions = questions[: cfg.limit]
    retriever = load_retriever(inputs["index"].path / "index")
    protocol = Protocol(template=cfg.template, doc_style=cfg.doc_style)
    env_cfg = EnvConfig(top_k=cfg.top_k, max_turns=cfg.max_turns)
    accepted, rejected, reasons = [], [], Counter()
    with writer, ctx.progress() as progress:
        task = progress.add_task("synthesize", total=len(questions))
        for lo in range(0, len(questions), cfg.batch_size):
            batch = questions[lo: lo + cfg.batch_size]
            trajs = run_rollouts(batch, oracle_generator(batch, protocol), retriever, protocol, env_cfg)
            for traj, q in zip(trajs, batch):
                ok, reason = verify_oracle(traj, q)
                row = {**traj.to_json(), "golden_answers": q["golden_answers"], "metadata": q.get("metadata", {})}
                (accepted if ok else rejected).append(row if ok else {**row, "reject_reason": reason})
                reasons[reason] += 1
            progress.advance(task, len(batch))
        if not accepted:
            raise UserError("synthesize: the teacher produced no accepted trajectory (see the reasons above)")
        write_jsonl(writer.dir / "trajectories.jsonl", accepted)
        write_jsonl(writer.dir / "rejected.jsonl", rejected)
        (writer.dir / "protocol.json").write_text(
            json.dumps({"template": cfg.template, "doc_style": cfg.doc_style}))
        searches = [len(r["retrieved"]) for r in accepted]
        writer.metrics.update({
            "questions": len(questions), "accepted": len(accepted), "rejected": len(rejected),
            "acceptance_rate": round(len(accepted) / len(questions), 4),
            "reasons": dict(reasons), "mean_searches": round(sum(searches) / len(searches), 3),
        })
    return ctx.done(writer)
