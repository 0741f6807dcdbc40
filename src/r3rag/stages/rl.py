"""`r3rag rl`: GRPO with TRL's GRPOTrainer and a multi-turn `rollout_func`.

Each rollout runs the environment loop (generate until `</search>`/`</answer>`, retrieve,
append `<information>`...) and returns `env_mask`, so retrieved tokens get no loss. The
reward is a weighted sum of named components (`em`, `f1`, `format`), each logged.

Usage:

    r3rag rl --set steps=30 --set num_generations=8 --set rewards='{em: 1.0, format: 0.1}'
    r3rag rl --set retriever=http://127.0.0.1:8000 --set index=    # search through a retrieval server
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from r3rag.env import EnvConfig, run_rollouts
from r3rag.jsonl import read_jsonl
from r3rag.protocol import Protocol
from r3rag.retrieval import is_url, open_retriever
from r3rag.stages.common import Context, resolve_inputs, set_threads
from r3rag.training import device_flags, load_protocol_dict, save_policy

INPUTS = {"policy": "sft", "world": "world", "index": "index"}


@dataclass
class Config:
    name: str = "default"
    policy: str = "sft:latest"
    world: str = "world:latest"
    index: str = "index:latest"
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    split: str = "train"
    limit: int = 0
    steps: int = 20
    prompts_per_step: int = 8
    num_generations: int = 8
    lr: float = 1e-5
    beta: float = 0.0
    loss_type: str = "dapo"
    temperature: float = 1.0
    rewards: dict = field(default_factory=lambda: {"em": 1.0, "format": 0.0})
    top_k: int = 3
    max_turns: int = 6
    max_new_tokens: int = 48
    max_completion_tokens: int = 512
    gen_batch_size: int = 64
    bf16: bool | str = "auto"  # true, false or auto (bf16 where supported)
    threads: int = 0
    seed: int = 0


def run(cfg: Config, ctx: Context):
    remote = is_url(cfg.retriever)  # the index is then not used at all
    inputs = resolve_inputs(cfg, {k: v for k, v in INPUTS.items() if not (remote and k == "index")}, ctx)
    writer = ctx.writer("rl", cfg, inputs, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    set_threads(cfg.threads)
    from r3rag.modeling import load_policy

    model, tokenizer = load_policy(inputs["policy"].path)
    protocol_dict = load_protocol_dict(inputs["policy"].path)
    questions = read_jsonl(inputs["world"].path / f"{cfg.split}.jsonl", required=("id", "question", "golden_answers"))
    questions = questions[: cfg.limit] if cfg.limit else questions
    retriever = open_retriever(cfg.retriever, inputs.get("index"))
    with writer:
        t0 = time.time()
        trainer = build_trainer(model, tokenizer, questions, retriever, Protocol(**protocol_dict), cfg,
                                writer.dir / "checkpoints")
        trainer.train()
        save_policy(trainer.model, tokenizer, writer.dir, protocol_dict, str(inputs["policy"].path))
        import shutil

        shutil.rmtree(writer.dir / "checkpoints", ignore_errors=True)
        writer.metrics.update(summarize_log(trainer.state.log_history))
        writer.metrics["train_seconds"] = round(time.time() - t0, 1)
    return ctx.done(writer)


def make_rollout_func(questions: list[dict], retriever, protocol: Protocol, tokenizer, cfg: Config):
    """TRL rollout_func: one multi-turn trajectory per prompt it is given, with env_mask."""
    from trl.models.utils import unwrap_model_for_generation

    from r3rag.generation.hf import HFGenerator

    by_prompt = {protocol.prompt(q["question"]): q for q in questions}
    env_cfg = EnvConfig(top_k=cfg.top_k, max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                        max_completion_tokens=cfg.max_completion_tokens)

    def rollout_func(prompts: list[str], trainer) -> dict:
        examples = [by_prompt[p] for p in prompts]
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
            gen = HFGenerator(model, tokenizer, batch_size=cfg.gen_batch_size, temperature=cfg.temperature)
            trajs = run_rollouts(examples, gen, retriever, protocol, env_cfg, tokenizer)
        return rollout_batch(trajs, tokenizer.eos_token_id, cfg.max_completion_tokens)

    return rollout_func


def rollout_batch(trajs, eos_id: int, max_completion_tokens: int) -> dict:
    """TRL's rollout dict. EOS is appended (as a model token) so TRL does not count a
    finished trajectory as truncated; the budget is enforced here, EOS kept last."""
    completion_ids, env_mask = [], []
    for t in trajs:
        ids, mask = t.completion()
        ids, mask = ids[: max_completion_tokens - 1] + [eos_id], mask[: max_completion_tokens - 1] + [1]
        completion_ids.append(ids)
        env_mask.append(mask)
    return {
        "prompt_ids": [t.prompt_ids for t in trajs], "completion_ids": completion_ids, "logprobs": None,
        "env_mask": env_mask, "pred_answer": [t.answer for t in trajs],
        "finish_reason": [t.finish_reason for t in trajs], "num_searches": [len(t.retrieved) for t in trajs],
    }


def build_trainer(model, tokenizer, questions, retriever, protocol: Protocol, cfg: Config, out_dir):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from r3rag.rewards import trl_reward_funcs

    ds = Dataset.from_dict({
        "prompt": [protocol.prompt(q["question"]) for q in questions],
        "golden_answers": [q["golden_answers"] for q in questions],
    })
    funcs, weights = trl_reward_funcs(cfg.rewards)
    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=cfg.steps, per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
        num_generations=cfg.num_generations, learning_rate=cfg.lr, beta=cfg.beta, loss_type=cfg.loss_type,
        temperature=cfg.temperature, max_completion_length=cfg.max_completion_tokens, reward_weights=weights,
        logging_steps=1, save_strategy="no", report_to=[], seed=cfg.seed, activation_checkpointing=False,
        lr_scheduler_type="constant", disable_tqdm=False, **device_flags(cfg.bf16),
    )
    return GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=ds, processing_class=tokenizer,
                       rollout_func=make_rollout_func(questions, retriever, protocol, tokenizer, cfg))


def summarize_log(history: list[dict]) -> dict:
    steps = [h for h in history if "reward" in h]
    if not steps:
        return {}
    first, last = steps[0], steps[-1]
    keys = [k for k in last if k.startswith("rewards/") or k in ("reward", "frac_reward_zero_std")]
    return {"steps": len(steps), **{f"first_{k}": round(first.get(k, 0.0), 4) for k in keys},
            **{f"last_{k}": round(last[k], 4) for k in keys},
            "mean_reward": round(sum(h["reward"] for h in steps) / len(steps), 4)}
