"""The GRPO settings, typed: what `r3rag.rl.grpo.build_trainer` and its rollout function read.

`r3rag rl`'s Config extends `GRPOSettings` with the stage's own keys (inputs, the starting
policy, rewards, LoRA), so YAML and `--set` keep one flat namespace (`rl.steps`, `rl.beta`...).
Every Literal is checked when the config is built (r3rag.util.config); `check_settings` checks the
settings that only make sense together, one clear line each.

Usage:
    cfg = GRPOSettings(steps=30, num_generations=8, loss_type="dr_grpo", scale_rewards="none")
    check_settings(cfg)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from r3rag.core.env import EnvSettings, check_env_settings
from r3rag.training.checkpoints import check_save_steps
from r3rag.util.config import check_literals, hashed_when_set, unhashed, unhashed_since_built
from r3rag.util.errors import UserError

LossType = Literal["dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
TOKEN_LEVEL_LOSSES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo")  # per-token advantages make sense
VllmMode = Literal["auto", "", "colocate", "server"]
Algorithm = Literal["grpo", "ppo", "rloo", "reinforce_pp"]


@dataclass
class GRPOSettings(EnvSettings):  # top_k, max_turns, max_new_tokens: r3rag.core.env
    # GRPO
    steps: int = 20  # optimizer steps
    prompts_per_step: int = 8  # questions per optimizer step, over all processes
    num_generations: int = 8  # group size
    steps_per_generation: int = 1  # optimizer steps per rollout batch
    num_iterations: int = 1  # passes over each rollout batch (mu)
    grad_accum: int = 1  # micro-batches per optimizer step (prompts_per_step x num_generations split over them)
    lr: float = 1e-5  # peak learning rate
    lr_scheduler: str = "constant"  # any of transformers' scheduler names
    warmup_ratio: float = 0.0  # share of the steps the learning rate warms up over
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # gradients clipped to this global norm
    beta: float = 0.0  # KL coefficient (0: no reference model; Search-R1 and DeepSeek-R1 use 0.001)
    # TRL's loss normalisation: dapo (tokens of the whole batch), grpo (per sequence), dr_grpo (Dr. GRPO: a
    # constant, max_completion_tokens), bnpo (tokens of the local batch); cispo, sapo, luspo, vespo: TRL's others
    loss_type: LossType = "dapo"
    # advantage = reward - group mean, divided by the group's std (group), the batch's (batch) or nothing
    # (none: Dr. GRPO, no question-difficulty bias)
    scale_rewards: Literal["group", "batch", "none"] = "group"
    epsilon: float = 0.2  # clip range of the probability ratio
    epsilon_high: float | None = None  # upper clip bound (clip-higher; DAPO: 0.28); None = epsilon
    dynamic_sampling: bool = False  # DAPO: replace groups whose rewards have zero variance with fresh questions
    dynamic_sampling_rounds: int = 4  # refill rounds per rollout batch before flat groups are let through
    # The algorithm (docs/rl.md): grpo (TRL's group-relative advantage), ppo (GAE against a learned
    # critic, r3rag.rl.ppo), rloo (leave-one-out baseline over each group), reinforce_pp (REINFORCE++:
    # returns whitened over the batch). Epochs and mini-batches over one rollout batch are
    # num_iterations (veRL's ppo_epochs) and steps_per_generation for every algorithm.
    algorithm: Algorithm = hashed_when_set("grpo", silent=True)
    # ppo, rloo, reinforce_pp: k1 KL to the start policy, in the reward
    kl_coef: float = hashed_when_set(0.0, silent=True)
    # entropy bonus in the loss (Search-R1's veRL config: 0.001)
    entropy_coef: float = hashed_when_set(0.0, silent=True)
    critic_lr: float = hashed_when_set(1e-5, silent=True)  # ppo: the critic's learning rate (its own AdamW)
    critic_warmup_steps: int = hashed_when_set(0, silent=True)  # ppo: first steps train the critic only
    # ppo: values move at most this far from the rollout's (0: off)
    value_clip: float = hashed_when_set(0.5, silent=True)
    gamma: float = hashed_when_set(1.0, silent=True)  # ppo, reinforce_pp: discount per model token
    lam: float = hashed_when_set(1.0, silent=True)  # ppo: GAE's lambda
    # ppo: trajectory (Search-R1: one sample per trajectory) or step (R3-RAG: each search step its own
    # episode, nothing bootstrapped across steps)
    ppo_unit: Literal["trajectory", "step"] = hashed_when_set("trajectory", silent=True)
    # temperatures the samples of a group cycle through (R3-RAG: [0.1, 0.4, 0.7, 1.0]); [] = temperature
    sample_temperatures: list[float] = hashed_when_set(default_factory=list, silent=True)
    # process reward (relevance, r3rag): folded into the trajectory's reward, or credited to each search step's tokens
    process_credit: Literal["trajectory", "step"] = "trajectory"
    # rollouts
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus sampling (1 = off)
    max_completion_tokens: int = 512  # token budget per trajectory (model + documents)
    gen_batch_size: int = 64  # transformers generation: sequences per generate call
    mask_retrieved: bool = True  # no loss on retrieved tokens (false: Search-R1's ablation)
    static_cache: bool = False  # transformers: compiled static-cache decoding (GPUs; see benchmarks/gpu.sh)
    # auto (colocate where vLLM is installed and a GPU present), "" (transformers), colocate or server
    vllm: VllmMode = "auto"
    # vllm=server: the server (r3rag serve-vllm), e.g. http://127.0.0.1:8001; out of the artifact's id, so a
    # run whose server died resumes on a new one at another address
    vllm_server_url: str = unhashed_since_built("")
    vllm_gpu_memory: float = 0.3  # vllm=colocate: share of the GPU's memory vLLM takes
    vllm_kv_cache_gb: int = unhashed(2)  # vllm=colocate on the CPU: RAM for vLLM's KV cache, in GiB
    vllm_max_model_len: int = unhashed(0)  # vllm=colocate: vLLM's context in tokens (0: the model's own)
    # model
    bf16: bool | str = "auto"  # true, false or auto (bf16 where supported)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, slower
    # dev evaluation during training
    eval_every: int = 0  # greedy dev EM every N steps (and before the first, and at the last); 0 = off
    eval_limit: int = 200  # dev questions evaluated (0 = all)
    keep: Literal["last", "best_dev"] = "last"  # the published policy: the last step, or the best on dev
    # checkpoints and logs
    save_steps: int = 10  # checkpoint every N steps (0 = never)
    keep_checkpoints: int = 2  # the newest N checkpoints are kept, older ones deleted
    report_to: list[str] = unhashed(default_factory=list)  # tensorboard, wandb...: logging, not training
    seed: int = 0  # questions drawn per step, sampling, LoRA's initial weights

    def __post_init__(self):
        check_literals(self, "rl")  # settings built in code skip the config's check


def check_settings(cfg: GRPOSettings) -> None:
    """The GRPO settings that only make sense together: one clear line each."""
    if cfg.keep == "best_dev" and cfg.eval_every <= 0:
        raise UserError("rl.keep=best_dev: set rl.eval_every to a number of steps (the dev evaluation picks the step)")
    for name, value in (
        ("eval_every", cfg.eval_every),
        ("eval_limit", cfg.eval_limit),
        ("dynamic_sampling_rounds", cfg.dynamic_sampling_rounds),
    ):
        if value < 0:
            raise UserError(f"rl.{name}: expected 0 or more, got {value}")
    check_save_steps("rl", cfg.save_steps)  # as base and sft: a negative one reached the Trainer
    if cfg.epsilon_high is not None and cfg.epsilon_high < cfg.epsilon:
        raise UserError(
            f"rl.epsilon_high: expected at least rl.epsilon ({cfg.epsilon}) (clip-higher widens the "
            f"upper bound; DAPO uses 0.28), got {cfg.epsilon_high}"
        )
    check_algorithm(cfg)
    check_env_settings(cfg, "rl")
    if cfg.context == "fold" and (cfg.process_credit == "step" or cfg.dynamic_sampling or cfg.ppo_unit == "step"):
        raise UserError(
            "rl.context=fold: each model turn is a row of its own, rewarded with its trajectory's reward; set "
            "process_credit=trajectory, dynamic_sampling=false and ppo_unit=trajectory"
        )
    if cfg.process_credit == "step" and cfg.loss_type not in TOKEN_LEVEL_LOSSES:
        raise UserError(
            f"rl.process_credit=step: loss_type {cfg.loss_type} weighs whole sequences; use one of "
            f"{', '.join(TOKEN_LEVEL_LOSSES)}"
        )


def check_algorithm(cfg: GRPOSettings) -> None:
    """The settings of ppo, rloo and reinforce_pp, and the GRPO settings they cannot honour."""
    for name, value in (("gamma", cfg.gamma), ("lam", cfg.lam)):
        if not 0 <= value <= 1:
            raise UserError(f"rl.{name}: expected a number in [0, 1], got {value}")
    if cfg.critic_lr <= 0:
        raise UserError(f"rl.critic_lr: expected a learning rate above 0, got {cfg.critic_lr}")
    for name, value in (
        ("kl_coef", cfg.kl_coef),
        ("entropy_coef", cfg.entropy_coef),
        ("value_clip", cfg.value_clip),
        ("critic_warmup_steps", cfg.critic_warmup_steps),
    ):
        if value < 0:
            raise UserError(f"rl.{name}: expected 0 or more, got {value}")
    if any(t <= 0 for t in cfg.sample_temperatures):
        raise UserError(f"rl.sample_temperatures: expected temperatures above 0, got {cfg.sample_temperatures}")
    algo = cfg.algorithm
    if algo == "grpo":
        if cfg.kl_coef:
            raise UserError(
                "rl.kl_coef: the KL penalty in the reward is ppo's, rloo's and reinforce_pp's; GRPO's is rl.beta"
            )
        if cfg.ppo_unit != "trajectory":
            raise UserError("rl.ppo_unit=step: set rl.algorithm=ppo (or reinforce_pp)")
        return
    if cfg.beta:
        raise UserError(f"rl.beta: {algo} puts its KL penalty in the reward; set rl.kl_coef instead (and rl.beta=0)")
    if cfg.dynamic_sampling and algo != "rloo":
        raise UserError(
            f"rl.dynamic_sampling: {algo} does not compare a question's samples with each other, so a group "
            "whose rewards are all equal still carries signal; set rl.dynamic_sampling=false"
        )
    if algo == "rloo" and cfg.num_generations < 2:
        raise UserError(
            f"rl.algorithm=rloo: needs rl.num_generations >= 2 (the leave-one-out baseline), got {cfg.num_generations}"
        )
    if algo == "rloo" and (cfg.process_credit == "step" or cfg.ppo_unit == "step"):
        raise UserError(
            "rl.algorithm=rloo: one advantage per trajectory; set rl.process_credit=trajectory and rl.ppo_unit=trajectory"
        )
    if cfg.ppo_unit == "step" and algo != "ppo" and algo != "reinforce_pp":
        raise UserError("rl.ppo_unit=step: set rl.algorithm=ppo (or reinforce_pp)")
    if algo == "ppo" and cfg.critic_warmup_steps >= cfg.steps:
        raise UserError(
            f"rl.critic_warmup_steps: {cfg.critic_warmup_steps} critic-only steps leave none of rl.steps "
            f"({cfg.steps}) for the policy"
        )
