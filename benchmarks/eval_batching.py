"""Batched greedy evaluation vs question-by-question, same policy, questions and retriever.

Runs the rollout loop (generate -> parse -> retrieve, until an answer) on N held-out world
questions twice: one generate call per turn for all questions (batch_size=N), and one
question at a time (batch_size=1). Uses the newest `runs/sft` policy when there is one
(`--policy DIR` to choose), else a freshly initialised tiny model (the speed ratio holds,
the answers are noise).

Usage:
    python benchmarks/eval_batching.py [--policy runs/sft/demo-...] [--n 128]
Last line: {"batching_speedup": ..., "batched_qps": ..., "sequential_qps": ..., "n": ...}
"""

from __future__ import annotations

import argparse
import json
import time

from policy import setup, steering  # benchmarks/policy.py

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.generation.hf import HFGenerator


def timed(questions, gen, retriever, protocol, tok) -> tuple[float, list]:
    t0 = time.perf_counter()
    trajs = run_rollouts(questions, gen, retriever, protocol, EnvConfig(max_new_tokens=48), tok)
    return time.perf_counter() - t0, trajs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy")
    ap.add_argument("--n", type=int, default=128)  # eval's default batch size
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    questions, retriever, model, tok, protocol, source = setup(args.policy, args.n, args.threads)
    batched_s, b_trajs = timed(
        questions,
        HFGenerator(model, tok, batch_size=args.n, logits_processors=steering(source, tok)),
        retriever,
        protocol,
        tok,
    )
    seq_s, s_trajs = timed(
        questions,
        HFGenerator(model, tok, batch_size=1, logits_processors=steering(source, tok)),
        retriever,
        protocol,
        tok,
    )
    same = sum(a.answer == b.answer for a, b in zip(b_trajs, s_trajs))
    print(f"policy: {source}")
    print(f"batched   : {batched_s:7.2f} s  ({args.n / batched_s:7.1f} questions/s)")
    print(f"sequential: {seq_s:7.2f} s  ({args.n / seq_s:7.1f} questions/s)")
    print(f"same answer in both modes: {same}/{args.n} (left padding can flip near-ties)")
    print(
        json.dumps(
            {
                "batching_speedup": round(seq_s / batched_s, 2),
                "batched_qps": round(args.n / batched_s, 1),
                "sequential_qps": round(args.n / seq_s, 1),
                "n": args.n,
            }
        )
    )


if __name__ == "__main__":
    main()
