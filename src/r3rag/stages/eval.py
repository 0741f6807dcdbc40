"""`r3rag eval`: EM/F1 of several systems on held-out questions, through the same rollout loop.

Systems: `direct` (answer with no retrieval), `rag` (retrieve top-k with the question, answer
once), `sft` and `rl` (the trained policies, searching step by step). `direct` and `rag`
run the baseline policy (the SFT model) with its answer forced at once. Writes
`predictions.jsonl` and `metrics.json` (`{"systems": {name: {"em", "f1", "n", ...}},
"seconds": {stage: wall seconds}}`) and prints a table.

Usage:

    r3rag eval --set limit=400
    r3rag eval --set systems='[sft]' --set rl=
    r3rag eval --set retriever=http://127.0.0.1:8000 --set index=    # search through a retrieval server
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from r3rag.artifacts import ArtifactRef, load_manifest
from r3rag.env import EnvConfig, run_rollouts
from r3rag.errors import UserError
from r3rag.jsonl import read_jsonl, write_jsonl
from r3rag.metrics import bootstrap_ci, cover_match, exact_match, f1_score
from r3rag.protocol import Protocol
from r3rag.retrieval import is_url, open_retriever
from r3rag.stages.common import Context, resolve_inputs, set_threads
from r3rag.training import load_protocol_dict

INPUTS = {"world": "world", "index": "index", "sft": "sft", "rl": "rl"}
MODES = {"direct": "direct", "rag": "rag", "sft": "iterative", "rl": "iterative"}


@dataclass
class Config:
    name: str = "default"
    world: str = "world:latest"
    index: str = "index:latest"
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    sft: str = "sft:latest"
    rl: str = "rl:latest"  # "" when there is no RL policy
    systems: list[str] = field(default_factory=lambda: ["direct", "rag", "sft", "rl"])
    baseline_policy: str = "sft"  # the model `direct` and `rag` use
    split: str = "test"
    limit: int = 400
    top_k: int = 3
    max_turns: int = 6
    max_new_tokens: int = 48
    batch_size: int = 128
    threads: int = 0
    seed: int = 0


def run(cfg: Config, ctx: Context):
    for s in cfg.systems:
        if s not in MODES:
            raise UserError(f"eval.systems: unknown system {s!r} (available: {', '.join(MODES)})")
    needed = {"world"} | {cfg.baseline_policy if MODES[s] != "iterative" else s for s in cfg.systems}
    if not is_url(cfg.retriever):  # a retrieval server replaces the index
        needed.add("index")
    fields = {k: v for k, v in INPUTS.items() if k in needed}
    for f in fields:
        if not getattr(cfg, f):
            raise UserError(f"eval: system(s) {cfg.systems} need input {f!r}, which is empty")
    inputs = resolve_inputs(cfg, fields, ctx)
    writer = ctx.writer("eval", cfg, inputs, INPUTS)
    if writer.existing:
        _print_table(json.loads((writer.existing.path / "metrics.json").read_text()), ctx)
        return ctx.skipped(writer)
    set_threads(cfg.threads)
    questions = read_jsonl(inputs["world"].path / f"{cfg.split}.jsonl", required=("id", "question", "golden_answers"))
    questions = questions[: cfg.limit] if cfg.limit else questions
    retriever = open_retriever(cfg.retriever, inputs.get("index"))
    with writer:
        t0 = time.time()
        systems, predictions = {}, []
        for system in cfg.systems:
            policy = inputs[system if MODES[system] == "iterative" else cfg.baseline_policy]
            trajs = evaluate_system(policy, questions, retriever, MODES[system], cfg, ctx, system)
            rows = [_prediction(system, t, q) for t, q in zip(trajs, questions)]
            systems[system] = summarize(rows)
            predictions.extend(rows)
        write_jsonl(writer.dir / "predictions.jsonl", predictions)
        seconds = stage_seconds(inputs)
        seconds["eval"] = round(time.time() - t0, 1)
        metrics = {"systems": systems, "seconds": seconds}
        (writer.dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        writer.metrics.update({s: {"em": m["em"], "f1": m["f1"], "n": m["n"]} for s, m in systems.items()})
        _print_table(metrics, ctx)
    return ctx.done(writer)


def evaluate_system(policy: ArtifactRef, questions, retriever, mode: str, cfg: Config, ctx: Context, label: str):
    from r3rag.generation.hf import HFGenerator
    from r3rag.modeling import load_policy

    model, tokenizer = load_policy(policy.path)
    protocol = Protocol(**load_protocol_dict(policy.path))
    env_cfg = EnvConfig(mode=mode, top_k=cfg.top_k, max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens)
    gen = HFGenerator(model, tokenizer, batch_size=cfg.batch_size, temperature=0.0)
    out = []
    with ctx.progress() as progress:
        task = progress.add_task(f"eval {label}", total=len(questions))
        for lo in range(0, len(questions), cfg.batch_size * 4):
            batch = questions[lo: lo + cfg.batch_size * 4]
            out.extend(run_rollouts(batch, gen, retriever, protocol, env_cfg, tokenizer))
            progress.advance(task, len(batch))
    return out


def _prediction(system: str, traj, q: dict) -> dict:
    gold = q["golden_answers"]
    needed = q.get("metadata", {}).get("supporting_docs", [])
    found = {d for step in traj.retrieved for d in step}
    return {
        "system": system, "id": q["id"], "question": q["question"], "golden_answers": gold,
        "answer": traj.answer, "em": exact_match(traj.answer, gold), "f1": f1_score(traj.answer, gold),
        "cover": cover_match(traj.answer, gold), "finish_reason": traj.finish_reason,
        "searches": len(traj.retrieved), "hops": q.get("metadata", {}).get("hops"),
        "gold_doc_recall": (len(set(needed) & found) / len(needed)) if needed else None,
        "turns": [{"role": t.role, "text": t.text} for t in traj.turns],
        "retrieved_docs": traj.documents, "gold_docs": needed,
    }


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    mean = lambda key: round(sum(r[key] for r in rows) / n, 4) if n else 0.0  # noqa: E731
    by_hops: dict[str, dict] = {}
    for h in sorted({r["hops"] for r in rows if r["hops"] is not None}):
        sub = [r for r in rows if r["hops"] == h]
        by_hops[str(h)] = {"em": round(sum(r["em"] for r in sub) / len(sub), 4), "n": len(sub)}
    recall = [r["gold_doc_recall"] for r in rows if r["gold_doc_recall"] is not None]
    return {"em": mean("em"), "f1": mean("f1"), "cover": mean("cover"), "n": n,
            "em_ci": bootstrap_ci([r["em"] for r in rows]), "f1_ci": bootstrap_ci([r["f1"] for r in rows]),
            "searches": mean("searches"), "finish_reasons": dict(Counter(r["finish_reason"] for r in rows)),
            "gold_doc_recall": round(sum(recall) / len(recall), 4) if recall else None, "by_hops": by_hops}


def stage_seconds(inputs: dict[str, ArtifactRef]) -> dict:
    """Wall seconds of every upstream stage, found by walking the input manifests."""
    seconds: dict[str, float] = {}
    todo = list(inputs.values())
    while todo:
        ref = todo.pop()
        seconds.setdefault(ref.stage, ref.manifest.get("seconds", 0.0))
        for inp in ref.manifest.get("inputs", {}).values():
            m = load_manifest(Path(inp["path"]))
            if m:
                todo.append(ArtifactRef(inp["stage"], inp["id"], Path(inp["path"]), m))
    order = ("world", "index", "synthesize", "sft", "rl")
    return {s: seconds[s] for s in order if s in seconds}


def _print_table(metrics: dict, ctx: Context) -> None:
    table = Table(title="evaluation (held-out questions)")
    for col in ("system", "EM", "F1", "n", "searches", "2-hop EM", "3-hop EM"):
        table.add_column(col, justify="right" if col != "system" else "left")
    for name, m in metrics["systems"].items():
        hops = m.get("by_hops", {})
        table.add_row(name, f"{m['em']:.3f}", f"{m['f1']:.3f}", str(m["n"]), f"{m['searches']:.2f}",
                      f"{hops['2']['em']:.3f}" if "2" in hops else "-", f"{hops['3']['em']:.3f}" if "3" in hops else "-")
    ctx.console.print(table)
    secs = metrics.get("seconds", {})
    if secs:
        ctx.console.print("seconds per stage: " + ", ".join(f"{k} {v:.0f}" for k, v in secs.items()))
