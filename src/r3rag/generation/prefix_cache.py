"""Keeping each trajectory's KV cache between turns, so a turn encodes only its new tokens.

Without it every turn re-encodes the whole context (prompt, earlier turns, documents): on the
tiny demo model that prefill is ~45% of rollout time. With it, a turn feeds each row only the
tokens its cache lacks (the environment's documents and the last sampled token).

Rows have different cached and new lengths, so a batch is laid out as
    [left pad | row's cached tokens] [pad | row's new tokens]
with attention-mask zeros on the pads: transformers derives position ids from the mask's
running sum, so positions continue exactly where each row's cache ends. After generation each
row's cache is cut back to its real tokens (no pads, nothing after its stop) and stored.

Usage (inside HFGenerator):
    store = PrefixCacheStore(pad_id)
    plan = store.plan(contexts_ids, keys)          # None: nothing cached, do a plain generate
    out = model.generate(input_ids=plan.input_ids, attention_mask=plan.mask,
                         past_key_values=plan.cache, return_dict_in_generate=True, ...)
    store.save(keys, seqs, plan.mask, out.past_key_values, kept_ids_per_row, steps)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class BatchPlan:
    keys: list[int]
    seqs: list[list[int]]
    input_ids: torch.Tensor  # [B, Lc + Ln]; the first Lc columns are covered by the cache
    mask: torch.Tensor
    cache: DynamicCache | None


class PrefixCacheStore:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id
        self.rows: dict[int, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.reused_tokens = 0  # context tokens not encoded again, over all calls

    def forget(self, keep: set[int]) -> None:
        self.rows = {k: v for k, v in self.rows.items() if k in keep}

    def _cached(self, key: int, seq: list[int]):
        """The stored (tokens, kv) when its tokens are a proper prefix of `seq`, else None."""
        entry = self.rows.get(key)
        if entry is None or len(entry[0]) >= len(seq) or seq[: len(entry[0])] != entry[0]:
            return None
        return entry

    def plan(self, seqs: list[list[int]], keys: list[int], device) -> BatchPlan | None:
        cached = [self._cached(k, s) for k, s in zip(keys, seqs)]
        if not any(cached):
            return None
        lens = [len(c[0]) if c else 0 for c in cached]
        self.reused_tokens += sum(lens)
        lc = max(lens)
        ln = max(len(s) - n for s, n in zip(seqs, lens))
        b = len(seqs)
        input_ids = torch.full((b, lc + ln), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, lc + ln), dtype=torch.long)
        for r, (s, n) in enumerate(zip(seqs, lens)):  # the cached columns' ids are never fed: pads stay
            new = s[n:]
            mask[r, lc - n: lc] = 1
            input_ids[r, lc + ln - len(new):] = torch.tensor(new, dtype=torch.long)
            mask[r, lc + ln - len(new):] = 1
        ref = next(c for c in cached if c)[1]
        cache = DynamicCache()
        for layer, (k0, v0) in enumerate(ref):
            k = k0.new_zeros((b, k0.shape[0], lc, k0.shape[2]))
            v = v0.new_zeros((b, v0.shape[0], lc, v0.shape[2]))
            for r, c in enumerate(cached):
                if c:
                    n = lens[r]
                    k[r, :, lc - n:] = c[1][layer][0]
                    v[r, :, lc - n:] = c[1][layer][1]
            cache.update(k.to(device), v.to(device), layer)
        return BatchPlan(keys, seqs, input_ids, mask, cache)

    def save(self, keys: list[int], seqs: list[list[int]], input_mask: torch.Tensor, cache, kept: list[list[int]],
             steps: int) -> None:
        """Store each row's real cached tokens: its unpadded input and the kept generated tokens
        that were fed back (the last sampled token of the call never is)."""
        width = input_mask.shape[1]
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for r, key in enumerate(keys):
            n_gen = min(len(kept[r]), steps - 1)
            pos = torch.cat([torch.nonzero(input_mask[r], as_tuple=True)[0].to(layers[0][0].device),
                             torch.arange(width, width + n_gen, device=layers[0][0].device)])
            kv = [(k[r, :, pos].detach(), v[r, :, pos].detach()) for k, v in layers]
            self.rows[key] = (seqs[r] + kept[r][:n_gen], kv)
