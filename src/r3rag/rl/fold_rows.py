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
the rows, padded to whole mini-batches with rows that train on nothing.

Usage:
    rows = turn_rows(traj, eos_id)                     # [{prompt_ids, completion_ids, env_mask, logprobs}]
    out = expand(trainer, out, rows_per_trajectory)    # in the trainer's _generate_and_score_completions
"""

from __future__ import annotations

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
    num_items_in_batch, old/ref log-probs when `out` had them."""
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
    return new


def _score(trainer, batch: dict, model) -> torch.Tensor:
    """Per-token log-probs of the rows' completions under `model` (None: the reference: TRL's
    reference model, or the policy with its adapters off)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        if model is not None:
            return trainer._get_per_token_logps_and_entropies(model, ids, attention, width)[0]
        if trainer.ref_model is not None:
            return trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, attention, width)[0]
        with trainer.accelerator.unwrap_model(trainer.model).disable_adapter():
            return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width)[0]
