"""Rollout speed on CPU: the batched multi-turn env vs one trajectory at a time, and vs plain `generate`.

1. Rollout batching: the rollout loop (generate -> parse -> retrieve, until an answer) on the
   same N questions with one generate call per turn for all of them (batch N) and one
   question at a time (batch 1). `rollout_batching_speedup` = sequential time / batched time.
2. Env overhead: the batched multi-turn rollouts above produce T model tokens in time t_env.
   A plain batched `model.generate` over the same N question prompts produces the same tokens
   without stop strings, retrieval or documents:
   - `env_overhead_cpu` = t_env / t_plain - 1, where each row generates as many tokens as its
     trajectory's model turns did (rows stop at their own length, as they would at EOS, so
     the call runs as long as its longest row: 3-hop rows are ~1.5x as long as 2-hop ones);
   - `env_overhead_equal_rows_cpu`: the same against a call where every row generates the mean
     (T/N tokens): no batched generate of these completions could be that even.
   Both count as env overhead the encoding of the retrieved documents (more tokens per
   trajectory than the model writes, and compute-bound on a CPU), the longer contexts the
   decode steps then attend to, the turns' straggler steps (a turn runs until its longest row
   stops) and the env's own work (stopping, parsing, retrieval, KV-cache bookkeeping). The
   breakdown (`share_*`) splits t_env into the model's forward passes that encode documents,
   its decode steps, and everything outside the model.
   The generator keeps each trajectory's KV cache between turns (`reuse_cache`);
   `--no-reuse-cache` measures the old path that re-encodes the whole context every turn.

Uses the newest `runs/sft` policy when there is one (`--policy DIR`), else a random tiny model
that `policy.ScriptedTurns` makes search twice and answer (its forward passes are its own).
Timings are the best of `--repeats` rounds, each timing the env and both plain calls
(this machine's timings drift by tens of percent); the one-at-a-time run is timed once.

Usage:
    python benchmarks/rollout.py [--policy runs/sft/demo-...] [--n 32] [--repeats 5]
Last line: {"rollout_batching_speedup": ..., "env_overhead_cpu": ..., ...}
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
from policy import setup, steering  # benchmarks/policy.py
from transformers import StoppingCriteria, StoppingCriteriaList

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.generation.hf import HFGenerator, left_pad


class ForwardTimer:
    """Wraps `model.forward` (keeping its signature, which `generate` inspects) and sums the time
    of calls that feed several tokens per row (encoding a prompt or documents) and of decode steps."""

    def __init__(self, model):
        self.encode = self.decode = 0.0
        inner = model.forward

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[1] > 1:
                self.encode += time.perf_counter() - t0
            else:
                self.decode += time.perf_counter() - t0
            return out

        model.forward = timed

    def reset(self) -> None:
        self.encode = self.decode = 0.0


class StopAtLength(StoppingCriteria):
    """Row r stops once it has generated lengths[r] tokens."""

    def __init__(self, start: int, lengths: list[int]):
        self.start, self.lengths = start, torch.tensor(lengths)

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.start) >= self.lengths.to(input_ids.device)


def rollouts(questions, gen, retriever, protocol, tok) -> tuple[float, list]:
    t0 = time.perf_counter()
    trajs = run_rollouts(questions, gen, retriever, protocol, EnvConfig(max_new_tokens=48), tok)
    return time.perf_counter() - t0, trajs


@torch.no_grad()
def plain_generate(model, tok, prompts: list[list[int]], lengths: list[int], sample: bool = False) -> float:
    """Seconds for one `generate` call over the prompts in which row r produces exactly lengths[r]
    tokens (on the model's device; CUDA is synchronised before the clock stops)."""
    ids, mask = left_pad(prompts, tok.pad_token_id)
    ids, mask = ids.to(model.device), mask.to(model.device)
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(
        input_ids=ids,
        attention_mask=mask,
        min_new_tokens=max(lengths),
        max_new_tokens=max(lengths),
        stopping_criteria=StoppingCriteriaList([StopAtLength(ids.shape[1], lengths)]),
        do_sample=sample,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-reuse-cache", action="store_true", help="re-encode the context every turn")
    args = ap.parse_args()
    questions, retriever, model, tok, protocol, source = setup(args.policy, args.n, args.threads)
    timer = ForwardTimer(model)
    reuse = not args.no_reuse_cache

    def generator(batch: int) -> HFGenerator:
        return HFGenerator(model, tok, batch_size=batch, reuse_cache=reuse, logits_processors=steering(source, tok))

    rollouts(questions[:4], generator(4), retriever, protocol, tok)  # warm up
    _, trajs = rollouts(questions, generator(args.n), retriever, protocol, tok)
    lengths = [tr.model_token_count() for tr in trajs]  # greedy: every run makes these same trajectories
    mean_len = max(1, round(sum(lengths) / len(trajs)))
    prompts = [tr.prompt_ids for tr in trajs]
    # Rounds of (env, plain, plain with even rows), best of N each: the three see the same
    # machine state, which on a shared box drifts by tens of percent within a minute.
    t_env = t_plain = t_even = float("inf")
    for _ in range(args.repeats):
        timer.reset()
        t, _ = rollouts(questions, generator(args.n), retriever, protocol, tok)
        if t < t_env:
            t_env, t_encode, t_decode = t, timer.encode, timer.decode
        t_plain = min(t_plain, plain_generate(model, tok, prompts, lengths))
        t_even = min(t_even, plain_generate(model, tok, prompts, [mean_len] * len(trajs)))
    t_seq, _ = rollouts(questions, generator(1), retriever, protocol, tok)
    report(args, source, trajs, lengths, t_env, t_seq, t_plain, t_even, t_encode, t_decode)


def report(args, source, trajs, lengths, t_env, t_seq, t_plain, t_even, t_encode, t_decode) -> None:
    tokens, n = sum(lengths), len(trajs)
    turns = sum(tr.model_turn_count() for tr in trajs) / n
    env_tokens = sum(len(t.ids or []) for tr in trajs for t in tr.turns if t.role == "env") / n
    print(
        f"policy: {source}; {n} questions, {turns:.2f} model turns, {tokens / n:.1f} model tokens "
        f"(rows {min(lengths)}-{max(lengths)}) and {env_tokens:.1f} document tokens per trajectory"
    )
    print(
        f"batched rollouts   : {t_env:7.3f} s  {tokens / t_env:8.0f} model tokens/s  (model: encoding "
        f"{t_encode / t_env:.0%}, decoding {t_decode / t_env:.0%}; outside the model {1 - (t_encode + t_decode) / t_env:.0%})"
    )
    print(
        f"one at a time      : {t_seq:7.3f} s  {tokens / t_seq:8.0f} model tokens/s  "
        f"(batching speedup {t_seq / t_env:.1f}x; target >= 5x)"
    )
    print(
        f"plain generate     : {t_plain:7.3f} s  {tokens / t_plain:8.0f} tokens/s  (each row its trajectory's "
        f"token count)  -> env overhead {t_env / t_plain - 1:+.1%} (target <= 25%)"
    )
    print(
        f"plain, even rows   : {t_even:7.3f} s  {tokens / t_even:8.0f} tokens/s  (every row the mean)"
        f"  -> env overhead {t_env / t_even - 1:+.1%}"
    )
    print(
        json.dumps(
            {
                "rollout_batching_speedup": round(t_seq / t_env, 2),
                "env_overhead_cpu": round(t_env / t_plain - 1, 3),
                "env_overhead_equal_rows_cpu": round(t_env / t_even - 1, 3),
                "share_encode": round(t_encode / t_env, 3),
                "share_decode": round(t_decode / t_env, 3),
                "share_outside_model": round(1 - (t_encode + t_decode) / t_env, 3),
                "rollout_tokens_per_s": round(tokens / t_env, 1),
                "n": n,
            }
        )
    )


if __name__ == "__main__":
    main()
