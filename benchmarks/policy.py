"""The policy the generation benchmarks run: the newest `runs/sft` artifact, or a random tiny model
steered by `ScriptedTurns` so that it searches like a trained policy.

Usage (from a benchmark script in this folder):
    from policy import load_or_make_policy, setup, steering
    questions, retriever, model, tokenizer, protocol, source = setup(args.policy, n=32, threads=1)
    gen = HFGenerator(model, tokenizer, logits_processors=steering(source, tokenizer))  # one per generator
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import torch

from r3rag.core.artifacts import list_artifacts
from r3rag.core.protocol import Protocol
from r3rag.data.world import world_vocabulary

RANDOM = "random tiny model (steered by ScriptedTurns)"


class ScriptedTurns:
    """A logits processor that makes a random model write like a searching policy, so that the
    env's turns, searches and documents are real: a row with fewer than `searches` searches in
    its context writes `<search>` + 4-12 world-vocabulary words + `</search>`, else `<answer>` + 1-3 words +
    `</answer>`. Every other token gets -inf, so sampling and greedy pick the scripted one; the
    forward passes are the model's own. A script depends only on its row's context (not on how
    rows are batched), so batched and one-at-a-time runs write the same trajectories. A generate
    call starts where the batch does not continue the previous step's ids."""

    def __init__(self, tok, searches: int = 2):
        self.tags = tok.convert_tokens_to_ids(["<search>", "</search>", "<answer>", "</answer>"])
        self.words = [i for i in tok.convert_tokens_to_ids(world_vocabulary()) if i != tok.unk_token_id]
        self.searches, self.pad, self.prev = searches, tok.pad_token_id, None

    def _script(self, context: list[int]) -> list[int]:
        rng = random.Random(zlib.crc32(str([t for t in context if t != self.pad]).encode()))
        if sum(t == self.tags[1] for t in context) < self.searches:
            return [self.tags[0], *rng.choices(self.words, k=rng.randint(4, 12)), self.tags[1]]
        return [self.tags[2], *rng.choices(self.words, k=rng.randint(1, 3)), self.tags[3]]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        prev, self.prev = self.prev, input_ids
        if not (
            prev is not None
            and input_ids.shape == (prev.shape[0], prev.shape[1] + 1)
            and torch.equal(input_ids[:, :-1], prev)
        ):  # a new call: a script per row
            self.start = input_ids.shape[1]
            scripts = [self._script(row) for row in input_ids.tolist()]
            width = max(map(len, scripts))  # a finished row repeats its closing tag (it is stopped)
            self.scripts = torch.tensor([s + s[-1:] * (width - len(s)) for s in scripts], device=scores.device)
        forced = self.scripts[:, min(input_ids.shape[1] - self.start, self.scripts.shape[1] - 1)]
        return torch.full_like(scores, float("-inf")).scatter_(1, forced[:, None], 0.0)


def steering(source: str, tok) -> list:
    """The logits processors a benchmark's generator needs: a fresh ScriptedTurns for the random
    model, none for a trained policy."""
    return [ScriptedTurns(tok)] if source == RANDOM else []


def load_or_make_policy(policy: str | None):
    """A trained policy gives realistic multi-turn rollouts; the random model searches only as
    `steering` makes it (its answers are noise), with the same forward passes."""
    from r3rag.training.helpers import load_protocol_dict
    from r3rag.training.modeling import load_policy, tiny_model, train_word_tokenizer

    if policy is None:
        found = list_artifacts(Path("runs"), "sft")
        policy = str(found[-1].path) if found else None
    if policy:
        model, tok = load_policy(Path(policy))
        return model, tok, Protocol(**load_protocol_dict(Path(policy))), policy
    tok = train_word_tokenizer([" ".join(world_vocabulary()), "Question :"])
    return tiny_model(tok).eval(), tok, Protocol(template="minimal", doc_style="plain"), RANDOM


def setup(policy: str | None, n: int, threads: int):
    """n held-out questions of a fixed world (seed 123), its BM25 index, and the policy."""
    import torch

    from r3rag.data.world import WorldConfig, generate_world
    from r3rag.retrieval.bm25 import BM25Retriever

    torch.set_num_threads(threads)
    world = generate_world(WorldConfig(seed=123))
    return (world.test[:n], BM25Retriever.build(world.docs), *load_or_make_policy(policy))
