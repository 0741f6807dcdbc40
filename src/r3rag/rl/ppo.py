"""PPO with a learned critic, RLOO and REINFORCE++ on TRL's GRPOTrainer (TRL 1.16 has no PPO).

TRL's GRPOTrainer already does what these share with GRPO: the rollouts (our multi-turn
`rollout_func`), the reference model's log-probs, the clipped-ratio policy loss over (B, T)
advantages with `tool_mask` (retrieved tokens: no loss), epochs (`num_iterations`, veRL's
`ppo_epochs`) and mini-batches (`steps_per_generation`) over one batch of rollouts, checkpoints.
`R3ragPPOTrainer` replaces the group-relative advantage by the algorithm's:

- ppo: the reward as a token sequence (`advantages.token_rewards`: outcome on the last model
  token, per-step process rewards on each step's last token, -kl_coef x k1 on every model token),
  GAE against the critic's values over the model's tokens only, whitened over the batch's model
  tokens. The critic (r3rag.rl.critic) takes one clipped value-loss step per policy micro-batch on
  the same rows, with its own AdamW (`critic_lr`), and trains alone for `critic_warmup_steps`.
  `ppo_unit=step` (R3-RAG): every model turn is an episode of its own, nothing bootstrapped across
  turns. Its rows are the trajectory's tokens, as R3-RAG's step samples are (question, earlier
  steps and their documents, then the step): the same tokens in the same context, so the same
  log-probs, in one forward pass instead of one per step. A step earns its process reward
  (`process_credit=step`), or without one the trajectory's reward (R3-RAG's `_orm` ablation).
- reinforce_pp: the same token rewards, discounted returns, whitened over the batch.
- rloo: each trajectory's reward (minus kl_coef x its summed k1) less the mean of its group's
  other rewards, one advantage per trajectory.

The KL penalty is in the reward (k1 = logp_old - logp_ref), not TRL's k3 term in the loss: TRL
is given beta = kl_coef so that it builds the reference and scores it, and the loss runs with
beta 0. Logged per step beside GRPO's lines: `critic/value_loss`, `critic/clip_frac`,
`critic/explained_variance`, `critic/value_mean`, `kl/k1_mean`, `advantages/mean` (before
whitening), `returns/mean`; TRL's `clip_ratio/*` are the policy's clip fractions.

Usage (r3rag.rl.grpo.build_trainer picks it when rl.algorithm is not grpo):
    trainer = R3ragPPOTrainer(model=..., args=grpo_config, ..., algo=cfg, critic=build_critic(model))
"""

from __future__ import annotations

from pathlib import Path

import torch

from r3rag.rl.advantages import (
    discounted_returns,
    explained_variance,
    gae,
    masked_mean,
    masked_whiten,
    rloo_advantages,
    token_rewards,
    value_loss,
)
from r3rag.rl.critic import critic_values, load_critic, save_critic, trained_parameters
from r3rag.training.trainers import R3ragGRPOTrainer, own_token_mask


class R3ragPPOTrainer(R3ragGRPOTrainer):
    def __init__(self, *args, algo, critic=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.algo = algo
        self.critic = self.critic_optimizer = None
        self._critic_micro_steps = 0
        self._rewards_per_func = None
        if algo.algorithm == "ppo":
            acc = self.accelerator
            self.critic = acc.prepare_model(critic) if acc.num_processes > 1 else critic.to(acc.device)
            self.critic_optimizer = torch.optim.AdamW(
                trained_parameters(self.critic).values(), lr=algo.critic_lr, weight_decay=algo.weight_decay
            )

    # ---- advantages -------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func  # every process's rows (TRL gathers them)

    def _compute_loss(self, model, inputs):
        beta, self.beta = self.beta, 0.0  # the KL is in the reward: TRL's k3 term stays out of the loss
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.beta = beta

    def _advantages(self, out: dict, inputs) -> dict:
        """TRL's batch with this algorithm's advantages (and, for ppo, the rollout's values and the
        returns the critic regresses on) in place of GRPO's."""
        mask = own_token_mask(out).float()
        rewards = self._trajectory_rewards()  # every process's
        local = slice(self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs))
        kl = self._k1(out, mask)
        algo = self.algo.algorithm
        folded = "row_of" in out  # context: fold: a row per model turn (r3rag.rl.fold_rows)
        if algo == "rloo":
            penalty = self._sequence_penalty(kl, out, len(inputs)) if kl is not None else 0.0
            advantages = rloo_advantages(rewards - penalty, self.num_generations)[local]
            advantages = _per_row(advantages, out) if folded else advantages
            self._log({"advantages/mean": advantages.mean().item()})
        else:
            ends = self._turn_ends(mask) if self.algo.ppo_unit == "step" and not folded else None
            outcome = _per_row(rewards[local], out) if folded else rewards[local]  # a folded row: its own episode
            step_rewards = None if folded else self._step_rewards(rewards[local])
            token_r = token_rewards(mask, outcome, kl, self.algo.kl_coef, step_rewards)
            if algo == "ppo":
                values = self._rollout_values(out) * mask
                raw, returns = gae(token_r, values, mask, self.algo.gamma, self.algo.lam, ends)
                out["values"], out["returns"] = values, returns
                self._log_critic_fit(values, returns, mask)
            else:
                raw = returns = discounted_returns(token_r, mask, self.algo.gamma, ends)
            advantages = masked_whiten(raw, mask, self._sum)
            self._log(
                {"advantages/mean": masked_mean(raw, mask, self._sum).item()}
                | {"returns/mean": masked_mean(returns, mask, self._sum).item()}
            )
        if kl is not None:
            self._log({"kl/k1_mean": masked_mean(kl, mask, self._sum).item()})
        out["advantages"] = advantages.to(out["completion_ids"].device)
        return out

    def _sequence_penalty(self, kl: torch.Tensor, out: dict, n: int) -> torch.Tensor:
        """kl_coef x each trajectory's summed k1 (a folded one's over all its rows), every process's."""
        per_row = self.algo.kl_coef * kl.sum(1)
        if "row_of" in out:
            real = out["row_of"] >= 0
            per_row = torch.zeros(n, device=kl.device).index_add_(0, out["row_of"][real], per_row[real])
        return self.accelerator.gather(per_row)

    def _trajectory_rewards(self) -> torch.Tensor:
        """Each trajectory's weighted reward, every process's rows, as TRL sums its components
        (unscorable rows: 0, as TRL's advantage for them)."""
        per_func = self._rewards_per_func
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        return torch.nan_to_num((per_func * weights).nansum(dim=1), nan=0.0)

    def _k1(self, out: dict, mask: torch.Tensor) -> torch.Tensor | None:
        """logp_old - logp_ref on the model's tokens (0 elsewhere), or None without a KL penalty."""
        if not self.algo.kl_coef:
            return None
        old = out.get("old_per_token_logps")
        if old is None:  # TRL skips them when the first pass's own log-probs can stand in
            ids, attention, width = _rows(out)
            with torch.no_grad():
                old, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention, width)
        return (old - out["ref_per_token_logps"]).float() * mask

    def _step_rewards(self, rewards: torch.Tensor) -> list[list[tuple[int, float]]] | None:
        """Per row, (position, reward) of each step: the process rewards (process_credit=step) on
        each credited step's last token; with ppo_unit=step and no process reward, every turn but
        the last gets the trajectory's reward (the last has it as the outcome)."""
        credit = self.row_extras.get("step_credit")
        if credit:
            return [[(end - 1, x) for _, end, x in row] for row in credit]
        if self.algo.ppo_unit == "step":
            return [[(end - 1, float(r)) for _, end in spans[:-1]] for spans, r in zip(self._turns(), rewards)]
        return None

    def _turns(self) -> list[list[list[int]]]:
        return self.row_extras.get("turn_spans") or []

    def _turn_ends(self, mask: torch.Tensor) -> torch.Tensor:
        ends = torch.zeros_like(mask)
        for row, spans in enumerate(self._turns()):
            for _, end in spans[:-1]:
                if end - 1 < ends.size(1):
                    ends[row, end - 1] = 1.0
        return ends

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(x, reduction="sum")

    def _log(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            self._metrics["train"][name].append(value)

    # ---- the critic -------------------------------------------------------------------------------

    def _rollout_values(self, out: dict) -> torch.Tensor:
        ids, attention, width = _rows(out)
        self.critic.eval()  # no dropout in the values the advantages are built on
        with torch.no_grad(), self.accelerator.autocast():
            return critic_values(self.critic, ids, attention, width)

    def _log_critic_fit(self, values, returns, mask) -> None:
        self._log(
            {
                "critic/value_mean": masked_mean(values, mask, self._sum).item(),
                "critic/explained_variance": explained_variance(values, returns, mask),
            }
        )

    def _prepare_inputs(self, generation_batch):
        batch = super()._prepare_inputs(generation_batch)
        if self.model.training:
            self._mini_batch = batch  # the rows the policy trains on now: the critic's too
        return batch

    def training_step(self, model, inputs, num_items_in_batch):
        if self.critic is None:
            return super().training_step(model, inputs, num_items_in_batch)
        if self.state.global_step < self.algo.critic_warmup_steps:
            self._critic_step(self._prepare_inputs(inputs))  # the policy's gradients stay None: Adam skips it
            self._step += 1  # what TRL's training_step counts its rollout buffer by
            return torch.zeros((), device=self.args.device)
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._critic_step(self._mini_batch)
        return loss

    def _critic_step(self, batch: dict) -> None:
        """One micro-batch of the critic's clipped value loss; its optimizer steps with the policy's."""
        ids, attention, width = _rows(batch)
        mask = own_token_mask(batch).float()
        self.critic.train()
        with self.accelerator.autocast():
            predicted = critic_values(self.critic, ids, attention, width)
        loss, clip_frac = value_loss(predicted, batch["values"], batch["returns"], mask, self.algo.value_clip)
        (loss / self.args.gradient_accumulation_steps).backward()
        self._log({"critic/value_loss": loss.item(), "critic/clip_frac": clip_frac.item()})
        self._critic_micro_steps += 1
        if self._critic_micro_steps % self.args.gradient_accumulation_steps == 0:
            torch.nn.utils.clip_grad_norm_(list(trained_parameters(self.critic).values()), self.args.max_grad_norm)
            self.critic_optimizer.step()
            self.critic_optimizer.zero_grad(set_to_none=True)

    # ---- checkpoints ------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        if (
            self.critic is not None and self.args.should_save
        ):  # first: a checkpoint is whole once the Trainer's files are
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            save_critic(self.critic, self.critic_optimizer, folder)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.critic is not None and checkpoint is not None:
            load_critic(self.critic, self.critic_optimizer, Path(checkpoint))


def _per_row(values: torch.Tensor, out: dict) -> torch.Tensor:
    """Per-trajectory `values` spread over a folded batch's rows (0 on padding rows)."""
    row_of = out["row_of"]
    return values.to(row_of.device)[row_of.clamp(min=0)] * (row_of >= 0)


def _rows(batch: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The prompt + completion ids and attention mask of TRL's batch, and the completion width."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return ids, attention, batch["completion_ids"].size(1)
