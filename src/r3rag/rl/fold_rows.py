"""RL on folded trajectories (`context: fold`): one training row per model turn.

A folded trajectory's turns were sampled from contexts that changed under it (each search's
documents shown in full for one turn, then as a stub), so its turns no longer form one token
sequence whose log-probabilities are those it was sampled with. As ASearcher and TRL's
multi-turn GRPO do, it becomes one row per model turn: the prompt is exactly the context that
turn was sampled from, the completion exactly that turn's tokens (the last turn's EOS by the
rollouts' rule: learned only where the model sampled it), each row with its trajectory's
advantage. Retrieved tokens sit in the prompts: no row trains on them.

TRL's trainer sees one row per trajectory (the last turn's, which carries the trajectory's
rewards); `expand` then replaces its batch by every row of every trajectory, each with its
trajectory's advantage (GRPO's, RLOO's) and index (`row_of`, for r3rag.rl.ppo: PPO and
REINFORCE++ make each row an episode of its own, rewarded with its trajectory's reward, as
R3-RAG's steps), the log-probabilities TRL needs (the rollout policy's, the reference's) scored on
the rows, padded to whole mini-batches with rows that train on nothing. The sampling log-probs the
generator returned (vLLM's, or transformers' with `logprobs=True`) become each row's
`sampling_per_token_logps`, and with vLLM TRL's importance-sampling correction is recomputed on the
rows as TRL computes it (`importance_ratio`: its mode, its clip bounds), its logged
`sampling/*` values then describing every row instead of the last turns TRL saw.

Usage:
    rows = turn_rows(traj, eos_id)                     # [{prompt_ids, completion_ids, env_mask, logprobs}]
    out = expand(trainer, out, rows_per_trajectory)    # in the trainer's _generate_and_score_completions
"""

from __future__ import annotations

import math

import torch

from r3rag.core.env import Trajectory


def turn_rows(traj: Trajectory, eos_id: int) -> list[dict]:
    """One row per model turn: the context it was sampled from, and its own tokens."""
    model = [i for i, t in enumerate(traj.turns) if t.role == "model"]
    rows = []
    for i in model:
        turn = traj.turns[i]
        ids = list(turn.ids or [])
        lps = list(turn.logprobs) if turn.logprobs is not None else [None] * len(ids)
        mask = [1] * len(ids)
        if i == model[-1]:  # the trajectory's end: an EOS, learned only where the model sampled it
            if traj.eos_sampled and ids and ids[-1] == eos_id:
                pass  # the generator kept the EOS it sampled: it is the one, learned
            else:
                ids, mask, lps = ids + [eos_id], mask + [int(traj.eos_sampled)], lps + [None]
        rows.append({"prompt_ids": traj.context_ids(upto=i), "completion_ids": ids, "env_mask": mask, "logprobs": lps})
    return rows


def _padded(seqs: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        if s:
            cols = slice(width - len(s), width) if left else slice(0, len(s))
            ids[r, cols], mask[r, cols] = torch.tensor(s), 1
    return ids, mask


def expand(trainer, out: dict, rows: list[list[dict]]) -> dict:
    """TRL's batch `out` (one row per trajectory, in `rows`' order) as every row of every
    trajectory: advantages repeated, log-probs rescored, whole mini-batches (padding rows learn
    nothing). Keys TRL's loss reads: prompt/completion ids and masks, tool_mask, advantages,
    num_items_in_batch, old/ref log-probs, sampling log-probs and vLLM's importance-sampling ratio
    when `out` had them (every per-token key TRL puts in its batch: none of `out`'s shapes is kept)."""
    flat = [(b, r) for b, rs in enumerate(rows) for r in rs]
    chunks = trainer.args.steps_per_generation
    empty = {"prompt_ids": [trainer._tokenizer.pad_token_id], "completion_ids": [], "env_mask": [], "logprobs": []}
    flat += [(None, empty)] * (-len(flat) % chunks)
    device = out["prompt_ids"].device
    prompt_ids, prompt_mask = _padded([r["prompt_ids"] for _, r in flat], trainer._tokenizer.pad_token_id, left=True)
    completion_ids, completion_mask = _padded(
        [r["completion_ids"] for _, r in flat], trainer._tokenizer.pad_token_id, left=False
    )
    tool_mask, _ = _padded([r["env_mask"] for _, r in flat], 0, left=False)
    row_of = torch.tensor([b if b is not None else -1 for b, _ in flat], device=device)
    advantages = out["advantages"][row_of.clamp(min=0)] * (row_of >= 0).to(out["advantages"].dtype)
    new = {
        "row_of": row_of,  # each row's trajectory (its index in TRL's batch; -1: a padding row)
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "tool_mask": tool_mask.to(device),
        "advantages": advantages.to(device),
    }
    trained = (new["completion_mask"] * new["tool_mask"]).sum()
    new["num_items_in_batch"] = trainer.accelerator.gather(trained).sum()
    for key, model in (("old_per_token_logps", trainer.model), ("ref_per_token_logps", None)):
        if key in out:
            new[key] = _score(trainer, new, model)
    if "sampling_per_token_logps" in out:
        width = new["completion_ids"].size(1)
        new["sampling_per_token_logps"] = sampling_logps([r["logprobs"] for _, r in flat], width).to(device)
    if "importance_sampling_ratio" in out:  # vLLM's rollouts, TRL's correction on: as TRL computes it, per row
        mask = new["completion_mask"] * new["tool_mask"]
        new["importance_sampling_ratio"] = importance_ratio(
            trainer, new["old_per_token_logps"], new["sampling_per_token_logps"], mask
        )
        _relog_sampling(trainer, new)
    return new


def sampling_logps(logprobs: list[list[float | None]], width: int) -> torch.Tensor:
    """TRL's `sampling_per_token_logps` for rows of these per-token sampling log-probs: None as NaN
    (TRL's reading of a log-prob vLLM could not give: no correction on that token), 0.0 past a
    row's end (TRL's right padding)."""
    out = torch.zeros((len(logprobs), width))
    for r, lps in enumerate(logprobs):
        if lps:
            out[r, : len(lps)] = torch.tensor([math.nan if x is None else x for x in lps])
    return out


def importance_ratio(trainer, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio (GRPOTrainer._generate_and_score_completions, TRL 1.16):
    exp(old - sampling) on the trained tokens, NaN differences read as 0 (ratio 1), per token (B, T)
    or summed per row (B, 1) by `vllm_importance_sampling_mode`, then truncated to or masked (0)
    outside [clip_min, clip_max]. A row's sequence is the turn it is, as TRL's is its completion."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    mode = trainer.vllm_importance_sampling_mode
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise ValueError(f"Unknown vLLM importance sampling level: {mode}")
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=low, max=high)
    low, high = -math.inf if low is None else low, math.inf if high is None else high
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


SAMPLING_METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


def _relog_sampling(trainer, batch: dict) -> None:
    """TRL has just logged how far vLLM's log-probs are from the trainer's, and its ratios, on the
    rows it saw (each trajectory's last turn): the same values over every real row take their place."""
    metrics = trainer._metrics["train"]
    if not all(metrics.get(k) for k in SAMPLING_METRICS):
        return
    for key, value in zip(SAMPLING_METRICS, sampling_stats(batch, trainer.accelerator.gather)):
        metrics[key][-1] = value


def sampling_stats(batch: dict, gather) -> tuple[float, ...]:
    """TRL's five `sampling/*` values over a batch's trained tokens (its rows, without padding rows
    with a per-row ratio), each process's reduced, then gathered as TRL reduces them."""
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    delta = (batch["old_per_token_logps"] - batch["sampling_per_token_logps"]).abs()
    delta = delta[mask & ~torch.isnan(delta)]  # tokens vLLM could not score: left out, as TRL does
    ratio = batch["importance_sampling_ratio"]
    ratios = ratio[batch["row_of"] >= 0].flatten() if ratio.size(1) == 1 else ratio[mask]
    zero = torch.zeros((), device=delta.device)
    local = [
        delta.mean() if delta.numel() else zero,
        delta.max() if delta.numel() else zero,
        ratios.min() if ratios.numel() else zero,
        ratios.mean() if ratios.numel() else zero,
        ratios.max() if ratios.numel() else zero,
    ]
    from trl.trainer.utils import nanmax, nanmin

    everyone = [gather(v.reshape(1)) for v in local]
    return (
        everyone[0].mean().item(),
        everyone[1].max().item(),
        nanmin(everyone[2]).item(),
        everyone[3].nanmean().item(),
        nanmax(everyone[4]).item(),
    )


def _score(trainer, batch: dict, model) -> torch.Tensor:
    """Per-token log-probs of the rows' completions under `model` (None: the reference, as TRL
    scores it: its reference model, or a PEFT policy with its "ref" adapter (the adapter as training
    began), or with its adapters off where TRL made none)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        if model is not None:
            return trainer._get_per_token_logps_and_entropies(model, ids, attention, width)[0]
        if trainer.ref_model is not None:
            return trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, attention, width)[0]
        from trl.trainer.utils import use_adapter

        peft = trainer.accelerator.unwrap_model(trainer.model)
        with use_adapter(peft, adapter_name="ref" if "ref" in peft.peft_config else None):
            return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width)[0]
