"""Rollout speed on CPU: the batched multi-turn env vs one trajectory at a time, and vs plain `generate`.

1. Rollout batching: the rollout loop (generate -> parse -> retrieve, until an answer) on the
   same N questions with one generate call per turn for all of them (batch N) and one
   question at a time (batch 1). `rollout_batching_speedup` = sequential time / batched time.
2. Env overhead: the batched multi-turn rollouts above produce T model tokens in time t_env.
   A plain batched `model.generate` over the same N prompts, forced to produce the same T
   tokens (T/N new tokens per row, no stop strings, no retrieval), takes t_plain.
   `env_overhead_cpu` = t_env / t_plain - 1: what the env costs on top of generating the
   tokens (per-turn stopping, parsing, retrieval, documents entering the context, and
   the turns' decode steps: each turn runs until its longest row stops). The generator keeps
   each trajectory's KV cache between turns (`reuse_cache`); `--no-reuse-cache` measures the
   old path that re-encodes the whole context every turn.

Uses the newest `runs/sft` policy when there is one (`--policy DIR`), else a random tiny model.

Usage:
    python benchmarks/rollout.py [--policy runs/sft/demo-...] [--n 32]
Last line: {"rollout_batching_speedup": ..., "env_overhead_cpu": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from r3rag.env import EnvConfig, run_rollouts
from r3rag.generation.hf import HFGenerator, left_pad

from policy import setup  # benchmarks/policy.py


def rollouts(questions, gen, retriever, protocol, tok) -> tuple[float, list]:
    t0 = time.perf_counter()
    trajs = run_rollouts(questions, gen, retriever, protocol, EnvConfig(max_new_tokens=48), tok)
    return time.perf_counter() - t0, trajs


@torch.no_grad()
def plain_generate(model, tok, prompts: list[list[int]], new_tokens: int) -> float:
    ids, mask = left_pad(prompts, tok.pad_token_id)
    t0 = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=mask, min_new_tokens=new_tokens, max_new_tokens=new_tokens,
                   do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-reuse-cache", action="store_true", help="re-encode the context every turn")
    args = ap.parse_args()
    questions, retriever, model, tok, protocol, source = setup(args.policy, args.n, args.threads)
    rollouts(questions[:4], HFGenerator(model, tok, batch_size=4, reuse_cache=not args.no_reuse_cache), retriever, protocol, tok)  # warm up
    # best of 3 for the fast measurements (noise on a shared machine); the slow one runs once
    t_env, trajs = min((rollouts(questions, HFGenerator(model, tok, batch_size=args.n, reuse_cache=not args.no_reuse_cache), retriever, protocol, tok)
                        for _ in range(3)), key=lambda r: r[0])
    t_seq, _ = rollouts(questions, HFGenerator(model, tok, batch_size=1, reuse_cache=not args.no_reuse_cache), retriever, protocol, tok)
    tokens = sum(len(t.ids or []) for tr in trajs for t in tr.turns if t.role == "model")
    turns = sum(tr.model_turn_count() for tr in trajs) / len(trajs)
    per_row = max(1, round(tokens / len(trajs)))
    t_plain = min(plain_generate(model, tok, [tr.prompt_ids for tr in trajs], per_row) for _ in range(3))
    print(f"policy: {source}; {args.n} questions, {turns:.2f} model turns and {tokens / len(trajs):.1f} "
          f"model tokens per trajectory")
    print(f"batched rollouts   : {t_env:7.2f} s  {tokens / t_env:8.0f} model tokens/s")
    print(f"one at a time      : {t_seq:7.2f} s  {tokens / t_seq:8.0f} model tokens/s  "
          f"(batching speedup {t_seq / t_env:.1f}x; target >= 5x)")
    print(f"plain generate     : {t_plain:7.2f} s  {per_row * len(trajs) / t_plain:8.0f} tokens/s  "
          f"({per_row} new tokens per row, one call)")
    print(f"env overhead       : {t_env / t_plain - 1:+.1%} (target <= 25%)")
    print(json.dumps({"rollout_batching_speedup": round(t_seq / t_env, 2),
                      "env_overhead_cpu": round(t_env / t_plain - 1, 3),
                      "rollout_tokens_per_s": round(tokens / t_env, 1), "n": args.n}))


if __name__ == "__main__":
    main()
