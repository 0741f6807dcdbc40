"""The advantage estimators beside GRPO's, and PPO's value loss: plain tensor functions over one
batch of completions (B rows, T completion tokens), no trainer, no model.

`mask` (B, T) is 1 on the model's own tokens, the ones the loss trains, and 0 on retrieved
documents and padding. The conventions are veRL's (`verl/trainer/ppo/core_algos.py`), with its
fix for agent loops (PR #2337): the recursions skip masked tokens, carrying the next value and the
running advantage through them unchanged, so documents between two model turns neither take a value
nor break the chain; with gamma = lam = 1 the advantage telescopes to (sum of later rewards) - V.

- `token_rewards`: the reward as a token sequence: -kl_coef x (logp - logp_ref) on every model
  token (k1, the KL penalty both seed papers put in the reward), the trajectory's reward on its last
  model token, and per-step rewards (`process_credit=step`) on each step's last token.
- `gae`: generalised advantage estimation against the critic's values; `ends` (ppo_unit=step)
  marks the last token of each step, where an episode ends: nothing is bootstrapped across it.
- `discounted_returns`: REINFORCE++'s returns (the same recursion without a critic).
- `rloo_advantages`: TRL's leave-one-out baseline over each prompt's group.
- `masked_whiten`: advantages centred and scaled over the model tokens of the whole batch.
- `value_loss`, `explained_variance`: the critic's clipped regression and how much of the
  returns' variance its values explain.

Usage:
    rewards = token_rewards(mask, outcome, kl=old_logps - ref_logps, kl_coef=0.001)
    adv, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    adv = masked_whiten(adv, mask)
    loss, clip_frac = value_loss(critic_values, values, returns, mask, clip=0.5)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over every process (identity on one)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """(B,) the position of each row's last 1 in `mask`, -1 for a row without one."""
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


def token_rewards(
    mask: torch.Tensor,
    outcome: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    step_rewards: list[list[tuple[int, float]]] | None = None,
) -> torch.Tensor:
    """(B, T) rewards: `outcome[b]` on row b's last model token, minus kl_coef x kl on every model
    token, plus each (position, value) of `step_rewards[b]` at its position (a step's last token)."""
    mask = mask.float()
    rewards = torch.zeros_like(mask)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float() * mask
    last = last_token_index(mask)
    rows = (last >= 0).nonzero().squeeze(1)
    rewards[rows, last[rows]] += outcome.float().to(rewards.device)[rows]
    for row, pairs in enumerate(step_rewards or []):
        for pos, value in pairs:
            rewards[row, pos] += value
    return rewards


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    ends: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (B, T) by GAE over the model's tokens only (veRL's recursion, masked
    tokens carried through). `ends` (B, T), 1 on the last token of an episode: the next value and
    the running advantage start again from 0 there (ppo_unit=step: no step bootstraps from the next)."""
    mask, values, rewards = mask.float(), values.float(), rewards.float()
    batch, width = mask.shape
    next_value = torch.zeros(batch, device=mask.device)
    running = torch.zeros(batch, device=mask.device)
    advantages = torch.zeros_like(mask)
    for t in reversed(range(width)):
        if ends is not None:
            stop = ends[:, t].bool()
            next_value, running = next_value.masked_fill(stop, 0.0), running.masked_fill(stop, 0.0)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        m = mask[:, t]
        next_value = values[:, t] * m + (1 - m) * next_value
        running = (delta + gamma * lam * running) * m + (1 - m) * running
        advantages[:, t] = running
    return advantages, advantages + values


def discounted_returns(
    rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, ends: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, T) the discounted sum of each model token's later rewards (REINFORCE++), masked tokens
    carried through as in `gae` (veRL's fix for returns reset at observations, its issue #7278)."""
    mask, rewards = mask.float(), rewards.float()
    running = torch.zeros(mask.size(0), device=mask.device)
    returns = torch.zeros_like(mask)
    for t in reversed(range(mask.size(1))):
        if ends is not None:
            running = running.masked_fill(ends[:, t].bool(), 0.0)
        m = mask[:, t]
        running = (rewards[:, t] + gamma * running) * m + (1 - m) * running
        returns[:, t] = running
    return returns


def rloo_advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """(B,) each reward minus the mean of the other rewards of its group (`group` consecutive rows,
    one prompt's samples): RLOO's leave-one-out baseline, as TRL's RLOOTrainer computes it."""
    if group < 2:
        raise ValueError("RLOO needs at least 2 samples per prompt")
    grouped = rewards.float().view(-1, group)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group - 1)
    return (grouped - baseline).view(-1)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def masked_mean(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce = _identity) -> torch.Tensor:
    totals = reduce(torch.stack([(x * mask).sum(), mask.sum()]).float())
    return totals[0] / totals[1].clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce = _identity) -> torch.Tensor:
    """`x` centred on its mean over the masked-in tokens and divided by their std (unbiased, as
    veRL's masked_whiten), the statistics summed over every process by `reduce`. Masked-out
    tokens come back 0: they never enter the loss, and 0 keeps them out of any later statistic."""
    mask = mask.float()
    totals = reduce(torch.stack([(x * mask).sum(), (x * x * mask).sum(), mask.sum()]).float())
    n = totals[2].clamp(min=1.0)
    mean = totals[0] / n
    var = (totals[1] / n - mean * mean).clamp(min=0.0) * n / (n - 1).clamp(min=1.0)
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


def value_loss(
    predicted: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss, 0.5 x max((V - R)^2, (V_clipped - R)^2) averaged over the model
    tokens (veRL's compute_value_loss, token-mean), where V_clipped stays within `clip` of the value
    the rollout saw (`clip` <= 0: no clipping); and the share of tokens where the clipped term won."""
    mask = mask.float()
    unclipped = (predicted - returns) ** 2
    if clip > 0:
        clipped = (old_values + (predicted - old_values).clamp(-clip, clip) - returns) ** 2
        losses, clip_frac = torch.maximum(unclipped, clipped), masked_mean((clipped > unclipped).float(), mask)
    else:
        losses, clip_frac = unclipped, torch.zeros((), device=mask.device)
    return 0.5 * masked_mean(losses, mask), clip_frac


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the model tokens: 1 a perfect critic, 0 one
    no better than a constant, negative one that is worse."""
    mask = mask.float()
    n = mask.sum().clamp(min=1.0)

    def var(x):
        mean = (x * mask).sum() / n
        return (((x - mean) ** 2) * mask).sum() / n

    total = var(returns.float())
    if total <= 0:
        return 0.0
    return float(1 - var((returns - values).float()) / total)
