"""The policy the generation benchmarks run: the newest `runs/sft` artifact, or a random tiny model.

Usage (from a benchmark script in this folder):
    from policy import load_or_make_policy, setup
    questions, retriever, model, tokenizer, protocol, source = setup(args.policy, n=32, threads=1)
"""

from __future__ import annotations

from pathlib import Path

from r3rag.artifacts import list_artifacts
from r3rag.data.world import world_vocabulary
from r3rag.protocol import Protocol


def load_or_make_policy(policy: str | None):
    """A trained policy gives realistic multi-turn rollouts; the random model's answers are noise
    (it rarely searches), but speed ratios of the generation path still hold."""
    from r3rag.modeling import load_policy, tiny_model, train_word_tokenizer
    from r3rag.training import load_protocol_dict

    if policy is None:
        found = list_artifacts(Path("runs"), "sft")
        policy = str(found[-1].path) if found else None
    if policy:
        model, tok = load_policy(Path(policy))
        return model, tok, Protocol(**load_protocol_dict(Path(policy))), policy
    tok = train_word_tokenizer([" ".join(world_vocabulary()), "Question :"])
    return tiny_model(tok).eval(), tok, Protocol(template="minimal", doc_style="plain"), "random tiny model"


def setup(policy: str | None, n: int, threads: int):
    """n held-out questions of a fixed world (seed 123), its BM25 index, and the policy."""
    import torch

    from r3rag.data.world import WorldConfig, generate_world
    from r3rag.retrieval.bm25 import BM25Retriever

    torch.set_num_threads(threads)
    world = generate_world(WorldConfig(seed=123))
    return (world.test[:n], BM25Retriever.build(world.docs), *load_or_make_policy(policy))
