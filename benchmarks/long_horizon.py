"""What a long trajectory costs per turn with every document kept against a folded context.

A long-horizon world (`world.long_horizon`), its BM25 index and a transformers policy of the
demo's shape (4 layers x 128, random weights: the cost of a turn does not depend on what the
weights say) roll out 33-search mentor chains, 16 at a time, ten documents a search (the world's
documents are one sentence each), once with `env.context: keep_all`
and once with `fold`, in the same run. The policy really generates every turn (`--new-tokens`
tokens over its whole context, its KV cache kept between turns as in every rollout); what it
writes is then replaced by the oracle teacher's turn, so both runs search the same documents for
the same number of turns. Per turn: the context's length in tokens and the generate call's
seconds (median of `--rounds` runs).

    python benchmarks/long_horizon.py [--threads 2] [--rounds 3]

The last line is JSON: tokens_per_turn_keep_all_t32, tokens_per_turn_fold_t32 (the context a row
holds at turn 32), seconds_per_turn_keep_all_t32, seconds_per_turn_fold_t32 and
fold_speedup_t32 (keep_all's seconds at turn 32 over fold's; goal >= 2), plus both curves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SEARCHES, BATCH, TURN = 33, 16, 32
TOP_K = 10  # documents per search: the world's one-sentence documents are short; ten a search come
# nearer what a real corpus returns per search (Search-R1: three ~100-word passages)


class Timed:
    """The policy generates (its real cost), then the oracle's turn stands in for its text."""

    def __init__(self, policy, oracle, tokenizer):
        self.policy, self.oracle, self.tokenizer = policy, oracle, tokenizer
        self.seconds: list[float] = []
        self.tokens: list[int] = []

    def generate(self, contexts, stop, max_new_tokens):
        self.tokens.append(max(len(c.context_ids()) for c in contexts))
        t0 = time.perf_counter()
        self.policy.generate(contexts, stop, max_new_tokens)
        self.seconds.append(time.perf_counter() - t0)
        return self.oracle.generate(contexts, stop, 10_000)


def rollout(world, retriever, questions, context: str, new_tokens: int) -> Timed:
    import torch

    from r3rag.core.env import EnvConfig, run_rollouts
    from r3rag.core.protocol import Protocol
    from r3rag.generation.hf import HFGenerator
    from r3rag.synthesis.teachers import oracle_generator
    from r3rag.training.modeling import tiny_model, train_word_tokenizer

    protocol = Protocol(template="minimal", doc_style="plain")
    from r3rag.data.world import world_vocabulary

    tok = train_word_tokenizer([" ".join(world_vocabulary(world.config)), "<think> </think>"])
    torch.manual_seed(0)
    model = tiny_model(tok, layers=4, hidden=128, heads=4, intermediate=512, max_positions=8192).eval()
    timed = Timed(HFGenerator(model, tok, batch_size=BATCH), oracle_generator(questions, protocol, tok), tok)
    cfg = EnvConfig(top_k=TOP_K, max_turns=SEARCHES + 1, max_new_tokens=new_tokens, max_completion_tokens=10**6)
    cfg.context = context
    trajs = run_rollouts(questions, timed, retriever, protocol, cfg, tok)
    assert all(len(t.retrieved) == SEARCHES for t in trajs), "the oracle's chains ran short"
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    a = ap.parse_args()
    import torch

    from r3rag.data.world import WorldConfig, generate_world
    from r3rag.retrieval.bm25 import BM25Retriever

    torch.set_num_threads(a.threads)
    world = generate_world(WorldConfig(seed=0, long_horizon=[SEARCHES, SEARCHES], long_per_count=BATCH))
    questions = [q for q in world.test if q["metadata"]["type"] == "mentor_chain"][:BATCH]
    retriever = BM25Retriever.build(world.docs)
    curves = {}
    for context in ("keep_all", "fold"):
        runs = [rollout(world, retriever, questions, context, a.new_tokens) for _ in range(a.rounds)]
        seconds = [statistics.median(r.seconds[t] for r in runs) for t in range(SEARCHES + 1)]
        curves[context] = {"tokens": runs[0].tokens, "seconds": [round(s, 4) for s in seconds]}
        print(f"{context}: context tokens per turn {runs[0].tokens}", file=sys.stderr)
        print(f"{context}: seconds per turn {[round(s, 3) for s in seconds]}", file=sys.stderr)
    k, f = curves["keep_all"], curves["fold"]
    out = {
        "tokens_per_turn_keep_all_t32": k["tokens"][TURN],
        "tokens_per_turn_fold_t32": f["tokens"][TURN],
        "seconds_per_turn_keep_all_t32": k["seconds"][TURN],
        "seconds_per_turn_fold_t32": f["seconds"][TURN],
        "fold_speedup_t32": round(k["seconds"][TURN] / f["seconds"][TURN], 2),
        "curves": curves,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
