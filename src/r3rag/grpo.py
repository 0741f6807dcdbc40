"""GRPO plumbing for `r3rag rl`: TRL's GRPOTrainer with a multi-turn `rollout_func`.

Each process rolls out its own share of the prompts TRL hands it: the environment loop
(generate until `</search>`/`</answer>`, retrieve, append the documents...) runs, every
reward component is scored, and TRL receives per-trajectory `completion_ids` with
`env_mask` (0 on retrieved tokens: no loss) ending in EOS (see
`training.completion_with_eos`), and `logprobs`: each sampled token's log-probability under the
distribution it was drawn from (None where unknown: documents, the appended EOS, a backend that
does not report them), for TRL's importance-sampling correction. The policy rolls out in eval
mode (no LoRA or other dropout), then goes back to training. Generation and retrieval time are
measured per step.

Usage:
    trainer = build_trainer(model, tokenizer, questions, retriever, protocol, scorer, cfg, work_dir, callbacks)
    trainer.train()
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from r3rag.env import EnvConfig, Trajectory, run_rollouts
from r3rag.errors import UserError
from r3rag.protocol import Protocol
from r3rag.training import checkpointing_flag, completion_with_eos, device_flags


class Timed:
    """A generator or retriever whose calls add up their wall time in `seconds`."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def _time(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def generate(self, contexts, stop, max_new_tokens):
        return self._time(self.inner.generate, contexts, stop, max_new_tokens)

    def search(self, queries, k):
        return self._time(self.inner.search, queries, k)


def rollout_batch(trajs: list[Trajectory], eos_id: int, max_completion_tokens: int,
                  mask_retrieved: bool = True) -> dict:
    """TRL's rollout dict: ids and env_mask from the one span rule shared with SFT, except the
    final EOS: learned only where the model sampled it (`eos_rule="sampled"`), never the one
    appended after a turn the env stopped at `</answer>`.
    `mask_retrieved=False` is Search-R1's ablation: retrieved tokens get loss like model tokens
    (the final EOS keeps its own rule)."""
    pairs = [completion_with_eos(t, eos_id, max_completion_tokens, eos_rule="sampled") for t in trajs]
    logprobs = [completion_logprobs(t, eos_id, len(ids)) for t, (ids, _) in zip(trajs, pairs)]
    if not mask_retrieved:
        pairs = [(ids, [1] * (len(mask) - 1) + mask[-1:]) for ids, mask in pairs]
    return {
        "prompt_ids": [t.prompt_ids for t in trajs], "completion_ids": [p[0] for p in pairs], "logprobs": logprobs,
        "env_mask": [p[1] for p in pairs], "pred_answer": [t.answer for t in trajs],
        "finish_reason": [t.finish_reason for t in trajs], "num_searches": [len(t.retrieved) for t in trajs],
    }


def completion_logprobs(traj: Trajectory, eos_id: int, n: int) -> list[float | None]:
    """The sampling logprob of each of the `n` ids `completion_with_eos` gives for `traj`, None
    where there is none (environment turns, a generator that did not record them). Its ids are the
    joined turns cut to `n - 1`, then EOS: that last one was sampled only if it is the EOS the
    generator kept (`eos_sampled`, ids ending in it, nothing cut). TRL reads None as NaN: no
    correction on that token (and masked tokens get no loss anyway)."""
    joined: list[float | None] = []
    for t in traj.turns:
        joined.extend(t.logprobs if t.role == "model" and t.logprobs is not None else [None] * len(t.ids or []))
    ids = [i for t in traj.turns for i in t.ids or []]
    kept_eos = traj.eos_sampled and len(ids) == n and ids[-1] == eos_id
    return joined[: n - 1] + [joined[-1] if kept_eos else None]


def make_rollout_func(questions: list[dict], retriever, protocol: Protocol, tokenizer, scorer, cfg, sampler=None):
    """TRL rollout_func: one multi-turn trajectory per prompt it is given (prompts arrive
    repeated num_generations times), scored by every reward component."""
    by_prompt = {protocol.context_prompt(q["question"], tokenizer): q for q in questions}
    env_cfg = EnvConfig(top_k=cfg.top_k, max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                        max_completion_tokens=cfg.max_completion_tokens)

    def rollout_func(prompts: list[str], trainer) -> dict:
        examples = [by_prompt[p] for p in prompts]
        t0 = time.perf_counter()
        ret = Timed(retriever)
        with generator(trainer, tokenizer, cfg) as gen:
            gen = Timed(gen)
            trajs = run_rollouts(examples, gen, ret, protocol, env_cfg, tokenizer)
        t1 = time.perf_counter()
        scores = scorer.score(trajs, examples)
        timing = {"generation": gen.seconds, "retrieval": ret.seconds, "rollout": t1 - t0,
                  "reward": time.perf_counter() - t1}
        if sampler is not None:
            sampler.add(trainer.state.global_step + 1, trajs, examples, scores)
        batch = rollout_batch(trajs, tokenizer.eos_token_id, cfg.max_completion_tokens, cfg.mask_retrieved)
        return {**batch, "scores": scores,
                "timing": timing}

    return rollout_func


class generator:
    """Context manager giving the rollout generator: vLLM through TRL when enabled, else the
    trainer's own model (unwrapped from DDP/DeepSpeed/FSDP) with transformers' generate, in
    eval mode: dropout (LoRA's too) would make the rollout policy a random perturbation of the
    one whose log-probabilities are trained; training mode comes back on exit."""

    def __init__(self, trainer, tokenizer, cfg):
        self.trainer, self.tokenizer, self.cfg = trainer, tokenizer, cfg

    def __enter__(self):
        if self.cfg.vllm:
            from r3rag.generation.vllm import VLLMGenerator

            self._ctx = None
            return VLLMGenerator(self.trainer, self.cfg.temperature, self.cfg.top_p)
        from trl.models.utils import unwrap_model_for_generation

        from r3rag.generation.hf import HFGenerator

        self._ctx = unwrap_model_for_generation(self.trainer.model_wrapped, self.trainer.accelerator)
        model = self._ctx.__enter__()
        self._was_training = model.training
        model.eval()
        self._model = model
        return HFGenerator(model, self.tokenizer, batch_size=self.cfg.gen_batch_size,
                           temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                           static_cache=self.cfg.static_cache, logprobs=True)

    def __exit__(self, *exc):
        if self._ctx is None:
            return False
        self._model.train(self._was_training)
        return self._ctx.__exit__(*exc)


def resolve_vllm(mode: str) -> str:
    """The rollout backend `rl.vllm` asks for: "" (transformers), colocate or server. "auto" (the
    default) is colocate where vLLM is installed and a GPU is present, else transformers.
    A clear error when vLLM is asked for by name and is not installed."""
    import importlib.util

    import torch

    if mode not in ("auto", "", "colocate", "server"):
        raise UserError(f"rl.vllm: expected auto, '' (transformers), colocate or server, got {mode!r}")
    installed = importlib.util.find_spec("vllm") is not None
    if mode == "auto":
        return "colocate" if installed and torch.cuda.is_available() else ""
    if mode and not installed:
        raise UserError(f"rl.vllm={mode}: vLLM is not installed (pip install 'trl[vllm]'); "
                        "set rl.vllm='' to generate with transformers")
    return mode


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def per_device_batch(cfg) -> int:
    """Completions per device per optimizer micro-step, from the global prompts per step."""
    total, parts = cfg.prompts_per_step * cfg.num_generations, world_size() * cfg.grad_accum
    if total % parts:
        raise UserError(f"rl: prompts_per_step x num_generations = {total} must divide evenly over "
                        f"{world_size()} process(es) x grad_accum {cfg.grad_accum}")
    return total // parts


def build_trainer(model, tokenizer, questions, retriever, protocol: Protocol, scorer, cfg, work_dir, callbacks=(),
                  sampler=None):
    from datasets import Dataset
    from trl import GRPOConfig

    from r3rag.rewards import trl_reward_funcs
    from r3rag.trainers import ResumableGRPOTrainer

    funcs, weights = trl_reward_funcs(scorer)
    cfg = replace(cfg, vllm=resolve_vllm(cfg.vllm))  # "auto" -> the backend this machine has
    vllm = dict(use_vllm=True, vllm_mode=cfg.vllm, vllm_server_base_url=cfg.vllm_server_url or None,
                vllm_gpu_memory_utilization=cfg.vllm_gpu_memory) if cfg.vllm else {}
    args = GRPOConfig(
        output_dir=str(work_dir / "checkpoints"), max_steps=cfg.steps, per_device_train_batch_size=per_device_batch(cfg),
        gradient_accumulation_steps=cfg.grad_accum, steps_per_generation=cfg.steps_per_generation * cfg.grad_accum,
        num_generations=cfg.num_generations, num_iterations=cfg.num_iterations, learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler, warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, beta=cfg.beta, loss_type=cfg.loss_type, scale_rewards=cfg.scale_rewards,
        epsilon=cfg.epsilon, temperature=cfg.temperature, top_p=cfg.top_p,
        max_completion_length=cfg.max_completion_tokens, reward_weights=weights,
        logging_steps=1, save_strategy="steps" if cfg.save_steps else "no", save_steps=cfg.save_steps or 500,
        save_total_limit=cfg.keep_checkpoints, report_to=list(cfg.report_to) or "none",
        seed=cfg.seed, **checkpointing_flag(cfg.gradient_checkpointing),
        disable_tqdm=False, ddp_find_unused_parameters=False, **vllm, **device_flags(cfg.bf16),
    )
    ds = Dataset.from_dict({"prompt": [protocol.context_prompt(q["question"], tokenizer) for q in questions]})
    rollout = make_rollout_func(questions, retriever, protocol, tokenizer, scorer, cfg, sampler)
    return ResumableGRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=ds,
                                processing_class=tokenizer, rollout_func=rollout, callbacks=list(callbacks))
