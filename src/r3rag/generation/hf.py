"""Batched generation with a local transformers model, stopping each row at a stop string.

Usage:
    gen = HFGenerator(model, tokenizer, batch_size=64, temperature=0.0)
    outs = gen.generate(trajectories, stop=("</search>", "</answer>"), max_new_tokens=64)
    rl = HFGenerator(model, tokenizer, temperature=1.0, logprobs=True)   # outs[i].logprobs: one per id
"""

from __future__ import annotations

import torch
from transformers import (
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from r3rag.core.env import Generated, Trajectory
from r3rag.generation.prefix_cache import PrefixCacheStore

# transformers 5.x renamed generate's `past_key_values` (argument and output field) to `cache`.
_CACHE_KWARG = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
_WINDOW = 8  # tokens decoded to look for a stop string; stop strings are shorter than this


def single_token_ids(tokenizer, stops: tuple[str, ...]) -> list[int] | None:
    """The stop strings' ids when each is exactly one token (then a stop is an id check),
    else None (stops are found by decoding the generated tail)."""
    ids = []
    for s in stops:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) != 1 or tokenizer.decode(enc).strip() != s:
            return None
        ids.append(enc[0])
    return ids


class _StopOnStrings(StoppingCriteria):
    """Per-row stop: the generated tail (never the context) contains a stop string. Rows from
    `n_real` on are padding (see `HFGenerator.static_cache`): stopped from their first token."""

    def __init__(self, tokenizer, stops: tuple[str, ...], start: int, n_real: int | None = None):
        self.tokenizer, self.stops, self.start, self.n_real = tokenizer, stops, start, n_real
        ids = single_token_ids(tokenizer, stops)
        self.stop_ids = None if ids is None else torch.tensor(ids)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        if self.stop_ids is not None:  # fast path: one id per stop string, no decoding per step
            done = torch.isin(input_ids[:, -1], self.stop_ids.to(input_ids.device))
        else:
            lo = max(self.start, input_ids.shape[1] - _WINDOW)
            tails = self.tokenizer.batch_decode(input_ids[:, lo:], skip_special_tokens=False)
            done = torch.tensor([any(s in t for s in self.stops) for t in tails], device=input_ids.device)
        if self.n_real is not None:
            done[self.n_real :] = True
        return done


class _SampledLogprobs(LogitsProcessor):
    """The last processor of a sampling call: each sampled token's log-probability under the
    distribution it was drawn from (after temperature and top-p), what TRL's importance-sampling
    correction compares the trainer's log-probabilities with. A processor sees a step's scores
    before its token is drawn, so each step's log-softmax is read at its token on the next call
    (or in `finish`); one (rows, vocab) tensor is kept, not one per step as `output_scores` would."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last is not None:
            self.steps.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        self._last = scores.float().log_softmax(-1)
        return scores

    def finish(self, new_ids: torch.LongTensor) -> list[list[float]]:
        """Per row, the logprob of each of `new_ids` (rows, n): generate may have run steps past them
        (deferred stop checks, then undone), and the last one was drawn after the last call."""
        n = new_ids.shape[1]
        if n > len(self.steps) and self._last is not None:
            self.steps.append(self._last.gather(1, new_ids[:, len(self.steps) : len(self.steps) + 1]).squeeze(1))
        if not n:
            return [[] for _ in range(new_ids.shape[0])]
        return torch.stack(self.steps[:n], 1).tolist()


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask), left padded so every row continues at the same position."""
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        input_ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[r, width - len(s) :] = 1
    return input_ids, mask


class HFGenerator:
    """`reuse_cache`: keep each trajectory's KV cache between turns (see prefix_cache.py), so a
    turn encodes only the tokens the environment added; the answers are those of a full
    re-encode (tests compare both). Off for models whose cache is not a plain DynamicCache.

    `static_cache`: the GPU path. Decode into a preallocated (static) KV cache, which
    transformers compiles (torch.compile, CUDA graphs) on CUDA: plain `generate` is bound by
    Python and kernel launches at small models and large batches. Each turn then re-encodes
    its context (cheap on a GPU next to decoding), so it replaces `reuse_cache`. A compiled
    step is specialised to its shapes, so every call is padded to `batch_size` rows (copies
    of its first row, stopped at once and dropped) and the cache length rounded up to 256: as
    turns finish rows, later calls reuse the compiled step instead of compiling again. Same
    tokens as the dynamic cache (tested greedy on CPU, where nothing is compiled).

    `logits_processors`: transformers `LogitsProcessor`s applied at every step of every call
    (e.g. to ban tokens; benchmarks/gpu.py uses one to make a random model write turns).

    `logprobs` (RL, when sampling): each `Generated` carries its ids' log-probabilities under the
    sampling distribution, for TRL's importance-sampling correction (`grpo.rollout_batch`)."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        reuse_cache: bool = True,
        static_cache: bool = False,
        logits_processors: tuple = (),
        logprobs: bool = False,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.temperature, self.top_p = batch_size, temperature, top_p
        self.logprobs = logprobs
        self.static_cache = static_cache
        self.logits_processors = LogitsProcessorList(logits_processors)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.store = PrefixCacheStore(self.pad_id) if reuse_cache and not static_cache else None
        self._alive: dict[int, Trajectory] = {}  # keeps the keyed trajectories (ids) alive

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        seqs = [c.context_ids() for c in contexts]
        if self.store is not None:  # caches of trajectories that are not continued are dropped
            self._alive = {id(c): c for c in contexts}
            self.store.forget(set(self._alive))
        # Similar lengths together: less padding per batch.
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        results: list[Generated | None] = [None] * len(seqs)
        for lo in range(0, len(order), self.batch_size):
            chunk = order[lo : lo + self.batch_size]
            outs = self._generate_batch(
                [seqs[i] for i in chunk], stop, max_new_tokens, [id(contexts[i]) for i in chunk]
            )
            for i, g in zip(chunk, outs):
                results[i] = g
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(
        self, seqs: list[list[int]], stop: tuple[str, ...], max_new_tokens: int, keys: list[int] | None = None
    ) -> list[Generated]:
        device = self.model.device
        n_real = len(seqs)
        if self.static_cache:  # one batch shape for every call (see the class docstring)
            seqs = seqs + [seqs[0]] * (self.batch_size - n_real)
        plan = self.store.plan(seqs, keys, device) if self.store is not None and keys else None
        if plan is not None:
            input_ids, attention, cache = plan.input_ids, plan.mask, plan.cache
        else:
            (input_ids, attention), cache = left_pad(seqs, self.pad_id), None
        width = input_ids.shape[1]
        sample = self.temperature > 0
        cache_args = {_CACHE_KWARG: cache}
        if self.static_cache:  # one cache size for most turns: a compiled forward is reused, not recompiled
            cache_args = {"cache_implementation": "static", "max_cache_len": -(-(width + max_new_tokens) // 256) * 256}
        recorder = _SampledLogprobs() if sample and self.logprobs else None
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            **cache_args,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_p=1.0 if sample else None,  # the warpers are in our list
            top_k=None,
            pad_token_id=self.pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
            stopping_criteria=StoppingCriteriaList([_StopOnStrings(self.tokenizer, stop, width, n_real)]),
            logits_processor=self._processors(sample, recorder),
            return_dict_in_generate=True,
            use_cache=True,
        )
        stop_ids = single_token_ids(self.tokenizer, stop)
        lps = recorder.finish(out.sequences[:, width:])[:n_real] if recorder is not None else [None] * n_real
        results = [self._cut(row[width:].tolist(), stop, stop_ids, lp) for row, lp in zip(out.sequences[:n_real], lps)]
        out_cache = getattr(out, _CACHE_KWARG, None)
        if self.store is not None and keys and isinstance(out_cache, DynamicCache):
            self.store.save(keys, seqs, attention, out_cache, [g.ids for g in results], out.sequences.shape[1] - width)
        return results

    def _processors(self, sample: bool, recorder: _SampledLogprobs | None) -> LogitsProcessorList:
        """The caller's processors, then (sampling) temperature and top-p as transformers would
        append them, then the recorder: it must see the final distribution, and generate puts
        the warpers it builds itself after every processor it is given."""
        if not sample:
            return self.logits_processors
        warpers = [TemperatureLogitsWarper(self.temperature)] if self.temperature != 1.0 else []
        warpers += [TopPLogitsWarper(self.top_p)] if self.top_p < 1.0 else []
        return LogitsProcessorList([*self.logits_processors, *warpers, *([recorder] if recorder else [])])

    def _cut(
        self, gen: list[int], stop: tuple[str, ...], stop_ids: list[int] | None, lps: list[float] | None = None
    ) -> Generated:
        eos = self.tokenizer.eos_token_id
        for j, tok in enumerate(gen):
            if tok == eos:  # the sampled EOS stays in the ids (it is trained on in RL), not in the text
                return Generated(
                    self.tokenizer.decode(gen[:j], skip_special_tokens=True),
                    gen[: j + 1],
                    "eos",
                    logprobs=lps and lps[: j + 1],
                )
            if stop_ids is not None:
                hit = tok in stop_ids
            else:
                tail = self.tokenizer.decode(gen[max(0, j - _WINDOW + 1) : j + 1], skip_special_tokens=False)
                hit = any(s in tail for s in stop)
            if hit:
                kept = gen[: j + 1]
                return Generated(
                    self.tokenizer.decode(kept, skip_special_tokens=True), kept, "stop", logprobs=lps and lps[: j + 1]
                )
        keep = [j for j, t in enumerate(gen) if t != self.pad_id or self.pad_id == eos]
        gen = [gen[j] for j in keep]
        return Generated(
            self.tokenizer.decode(gen, skip_special_tokens=True), gen, "length", logprobs=lps and [lps[j] for j in keep]
        )
