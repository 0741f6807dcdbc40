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

Where things live: the settings are typed in r3rag.rl.settings (`GRPOSettings`, which `r3rag
rl`'s Config extends; `build_trainer` reads nothing else), the batch TRL receives and dynamic
sampling are plain functions in r3rag.rl.batch (re-exported here), and this module holds
what needs the trainer: the rollout function, the rollout generator, the trainer and DevEval.

Against flat or collapsing GRPO (settings of `r3rag rl`, see r3rag.rl.settings):
- dynamic sampling (DAPO; TRL has no option for it): `dynamic_sample` drops each group whose
  rollouts all earn the same reward (no advantage, no gradient) and refills the batch with
  groups of fresh questions, at most `dynamic_sampling_rounds` times; groups still missing then
  are filled with dropped ones (TRL needs the batch size; they add nothing to the loss).
  The counts are logged as `rollout/dropped_groups`, `rollout/refill_rounds`, `rollout/flat_groups`.
- per-step credit (`process_credit=step`): `rollout_batch` adds `step_credit`, the token spans
  of each search step and its process reward, which `trainers.R3ragGRPOTrainer` turns into
  per-token advantages.
- dev evaluation (`DevEval`): greedy EM on dev questions every N steps through the same env
  loop, logged beside the training reward; the best step's weights kept for `keep=best_dev`.

Usage:
    trainer = build_trainer(model, tokenizer, questions, retriever, protocol, scorer, cfg, work_dir, callbacks,
                            dev_questions=dev)
    trainer.train()
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from transformers import TrainerCallback

from r3rag.core.env import run_rollouts
from r3rag.core.metrics import exact_match, f1_score
from r3rag.core.protocol import Protocol
from r3rag.generation.vllm import (
    INSTALL_HINT,
    colocated_engine,
    guard_module_scan,
    keep_cpu_weights_loadable,
    on_gpu,
)
from r3rag.rl.batch import (  # noqa: F401  (re-exported: r3rag.rl.grpo is where callers find them)
    check_whole_groups,
    completion_logprobs,
    dynamic_sample,
    fresh_questions,
    rollout_batch,
    step_spans,
)
from r3rag.rl.settings import GRPOSettings, check_settings
from r3rag.training.helpers import checkpointing_flag, device_flags, save_flags
from r3rag.util.errors import UserError


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


def make_rollout_func(
    questions: list[dict], retriever, protocol: Protocol, tokenizer, scorer, cfg: GRPOSettings, sampler=None
):
    """TRL rollout_func: one multi-turn trajectory per prompt it is given (prompts arrive
    repeated num_generations times), scored by every reward component; with
    `cfg.dynamic_sampling`, flat groups are replaced by groups of fresh questions."""
    by_prompt = {protocol.context_prompt(q["question"], tokenizer): q for q in questions}
    env_cfg = cfg.env_config(max_completion_tokens=cfg.max_completion_tokens)

    def rollout_func(prompts: list[str], trainer) -> dict:
        examples = [by_prompt[p] for p in prompts]
        t0 = time.perf_counter()
        ret, scoring = Timed(retriever), Timed(None)
        gen = Timed(None)

        def roll(exs: list[dict]) -> tuple:
            trajs = rollouts_at_temperatures(exs, trainer, tokenizer, cfg, gen, ret, protocol, env_cfg)
            return exs, trajs, *scoring._time(scorer.score_steps, trajs, exs)

        if cfg.dynamic_sampling:
            check_whole_groups(prompts, cfg.num_generations)
            from r3rag.rl.rewards import group_has_signal

            draw = fresh_questions(
                questions, examples, cfg.seed, trainer.state.global_step, trainer.accelerator.process_index
            )
            (examples, trajs, scores, steps), sampling = dynamic_sample(
                examples,
                cfg.num_generations,
                roll,
                draw,
                lambda part: group_has_signal(scorer, part[2], part[3]),
                cfg.dynamic_sampling_rounds,
            )
        else:
            (_, trajs, scores, steps), sampling = roll(examples), {}
        timing = {
            "generation": gen.seconds,
            "retrieval": ret.seconds,
            "rollout": time.perf_counter() - t0 - scoring.seconds,
            "reward": scoring.seconds,
        }
        if sampler is not None:
            sampler.add(trainer.state.global_step + 1, trajs, examples, scores)
        batch = rollout_batch(
            trajs,
            tokenizer.eos_token_id,
            cfg.max_completion_tokens,
            cfg.mask_retrieved,
            steps if scorer.step_credit else None,
            turns=cfg.ppo_unit == "step",
            fold=cfg.context == "fold",
        )
        # The refilled groups' prompt_ids are what TRL trains on; its own `prompts` list only feeds its logs.
        return {**batch, "scores": scores, "timing": timing, "sampling": sampling}

    return rollout_func


def rollouts_at_temperatures(examples, trainer, tokenizer, cfg: GRPOSettings, timer: Timed, ret, protocol, env_cfg):
    """The trajectories of `examples` (each prompt's samples in a row, as TRL repeats them), the
    i-th sample of a group drawn at `cfg.sample_temperatures[i % len]` (R3-RAG's mix; one run of
    the env loop per temperature), or all at `cfg.temperature`; generation time goes to `timer`."""
    temps = cfg.sample_temperatures or [cfg.temperature]
    trajs: list = [None] * len(examples)
    for j, temperature in enumerate(temps):
        rows = [i for i in range(len(examples)) if i % cfg.num_generations % len(temps) == j]
        if not rows:
            continue
        with generator(trainer, tokenizer, replace(cfg, temperature=temperature)) as gen:
            timer.inner = gen
            done = run_rollouts([examples[i] for i in rows], timer, ret, protocol, env_cfg, tokenizer)
        for i, traj in zip(rows, done):
            trajs[i] = traj
    return trajs


class generator:
    """Context manager giving the rollout generator: vLLM through TRL when enabled, else the
    trainer's own model (unwrapped from DDP/DeepSpeed/FSDP) with transformers' generate, in
    eval mode: dropout (LoRA's too) would make the rollout policy a random perturbation of the
    one whose log-probabilities are trained; training mode comes back on exit. A LoRA policy
    generates with its adapters merged into the base weights (peft's merge_adapter, as TRL does
    for its vLLM sync) and peft's wrappers out of the way (`merge_lora`): one matrix product per
    layer instead of three in every decode step; on exit the wrappers go back and the adapters are
    unmerged (the base weights come back up to float rounding, as after TRL's sync)."""

    def __init__(self, trainer, tokenizer, cfg: GRPOSettings):
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
        sharded = self.trainer.is_deepspeed_enabled or self.trainer.is_fsdp_enabled  # shards: leave as they are
        self._restore = None if sharded else merge_lora(model)
        return HFGenerator(
            model,
            self.tokenizer,
            batch_size=self.cfg.gen_batch_size,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            static_cache=self.cfg.static_cache,
            logprobs=True,
        )

    def __exit__(self, *exc):
        if self._ctx is None:
            return False
        if self._restore is not None:
            self._restore()
        self._model.train(self._was_training)
        return self._ctx.__exit__(*exc)


def merge_lora(model):
    """Merge a peft LoRA model's adapters into its base weights for generation and take peft's
    layer wrappers out of the forward path (each would still cost a Python call per layer and
    token: on a small model that is most of what LoRA rollouts cost more); returns the function
    that puts the wrappers back and unmerges, or None (not a peft model, or already merged)."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel) or any(getattr(m, "merged", False) for m in model.modules()):
        return None
    model.merge_adapter()
    swapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, module.base_layer)  # the merged weight, without the wrapper
            swapped.append((parent, child, module))

    def restore() -> None:
        for parent, child, module in swapped:
            setattr(parent, child, module)
        model.unmerge_adapter()

    return restore


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
        raise UserError(
            f"rl.vllm={mode}: vLLM is not installed ({INSTALL_HINT}); set rl.vllm='' to generate with transformers"
        )
    return mode


def trl_vllm_flags(cfg: GRPOSettings) -> dict:
    """GRPOConfig's vLLM flags. On the CPU (vLLM's CPU build) TRL's `vllm_gpu_memory_utilization`
    would be read as a share of RAM, refused when that much is not free: the KV cache is sized in
    GiB instead, through the variable vLLM's CPU backend reads (a user's own setting wins). A server
    without CUDA gets the weights over gloo (r3rag.generation.vllm_server)."""
    if cfg.vllm == "colocate" and not on_gpu():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.vllm_kv_cache_gb))
        guard_module_scan()  # TRL starts the engine in this process
        keep_cpu_weights_loadable()  # which TRL's weight sync loads into every step
        colocated_engine()  # fp32 (the trainer's weights as they are; vLLM's auto: bf16), eager
    if cfg.vllm == "server" and not on_gpu():  # TRL's weight sync is NCCL's: to a CPU server over gloo
        from r3rag.generation.vllm_server import use_gloo_weight_sync

        use_gloo_weight_sync()
    return dict(
        use_vllm=True,
        vllm_mode=cfg.vllm,
        vllm_server_base_url=cfg.vllm_server_url or None,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory,
        vllm_max_model_length=cfg.vllm_max_model_len or None,
    )


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def per_device_batch(cfg: GRPOSettings) -> int:
    """Completions per device per optimizer micro-step, from the global prompts per step."""
    total, parts = cfg.prompts_per_step * cfg.num_generations, world_size() * cfg.grad_accum
    if total % parts:
        raise UserError(
            f"rl: prompts_per_step x num_generations = {total} must divide evenly over "
            f"{world_size()} process(es) x grad_accum {cfg.grad_accum}"
        )
    return total // parts


def build_trainer(
    model,
    tokenizer,
    questions,
    retriever,
    protocol: Protocol,
    scorer,
    cfg: GRPOSettings,
    work_dir,
    callbacks=(),
    sampler=None,
    dev_questions: list[dict] | None = None,
    critic=None,
):
    """TRL's trainer for `cfg.algorithm`: R3ragGRPOTrainer for grpo, r3rag.rl.ppo's for ppo, rloo
    and reinforce_pp (ppo's critic built from `model` unless given)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from r3rag.rl.rewards import trl_reward_funcs
    from r3rag.training.trainers import R3ragGRPOTrainer

    check_settings(cfg)
    funcs, weights = trl_reward_funcs(scorer)
    cfg = replace(cfg, vllm=resolve_vllm(cfg.vllm))  # "auto" -> the backend this machine has
    vllm = trl_vllm_flags(cfg) if cfg.vllm else {}
    per_device = per_device_batch(cfg)
    if cfg.dynamic_sampling and per_device * cfg.steps_per_generation * cfg.grad_accum % cfg.num_generations:
        raise UserError(
            "rl.dynamic_sampling: each process must roll out whole groups (prompts_per_step x "
            f"steps_per_generation must divide over the {world_size()} process(es))"
        )
    args = GRPOConfig(
        output_dir=str(work_dir / "checkpoints"),
        max_steps=cfg.steps,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=cfg.grad_accum,
        steps_per_generation=cfg.steps_per_generation * cfg.grad_accum,
        num_generations=cfg.num_generations,
        num_iterations=cfg.num_iterations,
        learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.beta if cfg.algorithm == "grpo" else cfg.kl_coef,  # the others: TRL scores the reference only
        entropy_coef=cfg.entropy_coef,
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_completion_length=cfg.max_completion_tokens,
        reward_weights=weights,
        logging_steps=1,
        **save_flags(cfg.save_steps, cfg.keep_checkpoints),
        report_to=list(cfg.report_to) or "none",
        seed=cfg.seed,
        **checkpointing_flag(cfg.gradient_checkpointing),
        disable_tqdm=False,
        ddp_find_unused_parameters=False,
        **vllm,
        **device_flags(cfg.bf16),
    )
    if cfg.sample_temperatures:  # vLLM's log-probs are at each sample's temperature, the trainer's at rl.temperature
        args.vllm_importance_sampling_correction = False
    ds = Dataset.from_dict({"prompt": [protocol.context_prompt(q["question"], tokenizer) for q in questions]})
    rollout = make_rollout_func(questions, retriever, protocol, tokenizer, scorer, cfg, sampler)
    dev = DevEval(dev_questions, retriever, protocol, tokenizer, cfg, Path(work_dir)) if dev_questions else None
    common = dict(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=ds,
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[*callbacks, *([dev] if dev else [])],
    )
    if cfg.algorithm == "grpo":
        trainer = R3ragGRPOTrainer(**common, step_credit_weight=scorer.process_weight() if scorer.step_credit else 0.0)
    else:
        from r3rag.rl.critic import build_critic
        from r3rag.rl.ppo import R3ragPPOTrainer

        if cfg.algorithm == "ppo" and critic is None:
            from transformers import set_seed

            set_seed(cfg.seed)  # the fresh value head's initial weights are the run's
            critic = build_critic(model)  # before any step moves the policy
        trainer = R3ragPPOTrainer(**common, algo=cfg, critic=critic)
    if cfg.context == "fold":
        from r3rag.rl.fold_rows import expand

        trainer.expand_rows = expand  # one row per model turn of each folded trajectory
    if dev:
        dev.trainer = trainer
    return trainer


# ---- evaluation on dev during training --------------------------------------------------------


def dev_scores(
    trainer, questions: list[dict], retriever, protocol: Protocol, tokenizer, cfg: GRPOSettings
) -> dict[str, float]:
    """Greedy EM and F1 of the trainer's current policy on `questions`, through the rollouts' env
    loop. Every process answers its share (a sharded model needs them all in the generate context)
    and the sums are gathered. Always transformers: vLLM's weights are synced only when the next
    rollout starts, so it would answer with the previous step's policy."""
    from accelerate.utils import gather_object

    acc = trainer.accelerator
    mine = questions[acc.process_index :: acc.num_processes]
    with generator(trainer, tokenizer, replace(cfg, vllm="", temperature=0.0)) as gen:
        trajs = run_rollouts(
            mine, gen, retriever, protocol, cfg.env_config(max_completion_tokens=cfg.max_completion_tokens), tokenizer
        )
    em = sum(exact_match(t.answer, q["golden_answers"]) for t, q in zip(trajs, mine))
    f1 = sum(f1_score(t.answer, q["golden_answers"]) for t, q in zip(trajs, mine))
    parts = gather_object([(em, f1, len(mine))])
    n = max(1, sum(p[2] for p in parts))
    return {"dev/em": sum(p[0] for p in parts) / n, "dev/f1": sum(p[1] for p in parts) / n}


class DevEval(TrainerCallback):
    """Dev EM before training, every `cfg.eval_every` steps and at the last step: logged in that
    step's metrics line (`dev/em`, `dev/f1`, `time/dev_eval`; before training, in `dev.json`
    only, as metrics.jsonl lines are training steps). `work/dev.json` records the start, the
    last and the best evaluation (highest EM, the earlier step on a tie); with `keep=best_dev`
    the best step's weights are saved to `work/best-<step>/` (the previous best's removed once
    dev.json names the new one, so a kill never leaves dev.json naming missing weights). A best
    found before a kill stays a candidate after `--resume`: its weights and EM are real."""

    def __init__(self, questions, retriever, protocol, tokenizer, cfg: GRPOSettings, work: Path):
        self.questions, self.retriever, self.protocol, self.tokenizer, self.cfg = (
            questions,
            retriever,
            protocol,
            tokenizer,
            cfg,
        )
        self.work, self.trainer = work, None  # the trainer is set once built
        self.path = work / "dev.json"
        self.record = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def on_train_begin(self, args, state, control, **kw):
        if state.global_step == 0:  # a resumed run evaluated its start before the kill
            self.record["start"] = self._evaluate(0)

    def on_step_end(self, args, state, control, **kw):
        step = state.global_step
        if step % self.cfg.eval_every == 0 or step == state.max_steps:
            t0 = time.perf_counter()
            scores = self._evaluate(step)
            self.trainer.extra_logs.update({**scores, "time/dev_eval": round(time.perf_counter() - t0, 4)})

    def _evaluate(self, step: int) -> dict[str, float]:
        scores = dev_scores(self.trainer, self.questions, self.retriever, self.protocol, self.tokenizer, self.cfg)
        best = self.record.get("best")
        if best is None or scores["dev/em"] > best["dev/em"]:
            if self.cfg.keep == "best_dev":
                self.trainer.save_model(str(self.work / f"best-{step}"))  # on every process: gathers shards
            self.record["best"] = {"step": step, **scores}
        self.record["last"] = {"step": step, **scores}
        if self.trainer.accelerator.is_main_process:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.record, indent=2))
            os.replace(tmp, self.path)
            for old in self.work.glob("best-*"):
                if old.name != f"best-{self.record['best']['step']}":
                    shutil.rmtree(old, ignore_errors=True)
        return scores
