"""`r3rag sft`: supervised cold start on teacher trajectories with TRL's SFTTrainer.

The loss covers only what the model writes: the prompt and every `<information>` span
(environment turns) get label -100. `view: trajectory` (Search-R1 style) trains on whole
trajectories; `view: step` (R3-RAG style) makes each step a sample whose prompt holds the
question, the earlier steps and their documents. Start from a tiny model built from a config with a
word-level tokenizer trained on the world (`model: tiny`), from the miniature's pretrained
base model (`base: base:latest`, see `r3rag base`), or from any transformers model id/path,
with LoRA (`model: Qwen/Qwen2.5-3B`, `lora: true`) or fully. The policy is saved merged. An
earlier policy's `model/` directory (`model: runs/sft/<id>/model`, its own tokenizer) continues
it: more SFT as a control matched to GRPO's updates (`max_steps`).

Checkpoints go to `runs/sft/.work-<id>/` every `save_steps` updates; rerunning a killed run with
the same settings continues from the last one (`resume=auto`, the default; `--resume` insists on
one, `resume=false` starts afresh), with the optimizer, scheduler, RNG and data order restored:
it ends where a straight run ends.

Reader baselines train here too, on `r3rag synthesize --set reader=closed-book|rag|gold` data
(the `qa` template): the loss is on the answer after the prefilled `<answer> ` and its EOS, and
a rag or gold reader's documents are part of its prompt (r3rag.training.helpers.framed_prompt), as eval's
`direct` and `rag` modes frame the saved policy.

Usage:

    r3rag sft --set epochs=2 --set lr=5e-4
    r3rag sft --set model=/models/Qwen2.5-0.5B --set lora=true --set lr=1e-4
    r3rag sft --set view=step
    r3rag sft --set model=runs/sft/<id>/model --set max_steps=200   # continue a policy for exactly 200 updates
    r3rag sft --set data=runs/synthesize/<a reader's id> --set limit=27000   # a reader baseline
    r3rag sft --resume                      # continue a killed run from its last checkpoint (same settings)
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from r3rag.core.artifacts import work_dir
from r3rag.stages.common import (
    Context,
    add_model_input,
    model_location,
    process_state,
    resolve_inputs,
    set_threads,
)
from r3rag.training.checkpoints import check_save_steps, prepare_work, step_of
from r3rag.training.helpers import LoraSettings, save_policy, tokenize_rows
from r3rag.util.config import hashed_when_set, unhashed
from r3rag.util.errors import UserError
from r3rag.util.jsonl import read_jsonl

INPUTS = {"data": "synthesize", "world": "world", "base": "base"}


@dataclass
class Config:
    name: str = "default"  # the artifact's name: runs/sft/<name>-<hash>
    data: str = "synthesize:latest"  # the synthesize artifact whose trajectories are trained on
    world: str = "world:latest"  # the tiny model's tokenizer vocabulary; "" for pretrained models
    model: str = "tiny"  # tiny: a fresh small model on the world's vocabulary; else model:latest, a hub id or path
    base: str = ""  # a base artifact (r3rag base) to start from instead of `model`, e.g. base:latest
    arch: str = "llama"  # model=tiny: llama or qwen2
    layers: int = 4  # model=tiny: transformer layers
    hidden: int = 128  # model=tiny: hidden size
    heads: int = 4  # model=tiny: attention heads
    intermediate: int = 512  # model=tiny: MLP inner size
    lora: bool = False  # train LoRA adapters (merged into the saved weights) instead of every weight
    lora_settings: LoraSettings = field(default_factory=LoraSettings)  # lora=true: the adapters' shape
    epochs: float = 1.0  # passes over the trajectories (fractions allowed)
    # optimizer updates: 0 = as many as `epochs` make; N > 0 = exactly N, the data cycled when one pass is
    # shorter (a control matched to another run's update count, e.g. GRPO's `steps`); `epochs` is then ignored
    max_steps: int = hashed_when_set(0)
    lr: float = 1e-3  # peak learning rate
    # after warmup: cosine decays the learning rate to 0 by the last update; constant holds it at `lr`
    lr_schedule: Literal["cosine", "constant"] = hashed_when_set("cosine")
    batch_size: int = 16  # samples per device step
    # how samples are dealt into batches: by_length (similar lengths together, the least padding; a batch
    # then tends to hold one question type) or random (any mix, padded to its longest)
    sampling: Literal["by_length", "random"] = hashed_when_set("by_length")
    grad_accum: int = 1  # device steps whose gradients make one optimizer update
    warmup_ratio: float = 0.03  # share of the updates the learning rate warms up over
    weight_decay: float = 0.0  # AdamW weight decay
    max_length: int = 1024  # tokens per sample; longer ones are cut at the end
    view: Literal["trajectory", "step"] = "trajectory"  # step: one sample per step (R3-RAG)
    # fold (with view: step): each step's sample holds the context env.context: fold showed it, every
    # search's documents but the last one's as their stub; keep_all: every document in full
    context: Literal["keep_all", "fold"] = hashed_when_set("keep_all", silent=True)
    limit: int = 0  # 0 = all trajectories
    bf16: bool | str = "auto"  # true, false or auto (bf16 where supported)
    # recompute each layer's activations in the backward pass: the same weights in less memory, a
    # little slower (SmolLM2-135M, 2 x 1,536 tokens on 2 CPU cores: peak RSS 9.2 -> 5.5 GB, +16% time);
    # a 7B model at 4,096 tokens needs it (LLaMA-Factory, R3-RAG's SFT, has it on)
    gradient_checkpointing: bool = unhashed(False)
    threads: int = unhashed(0)  # CPU threads: how fast, not what is trained
    # checkpoints in runs/sft/.work-<id>/ every N optimizer updates (0 = none): what a killed run resumes from
    save_steps: int = unhashed(200)
    # auto: a rerun after a kill continues from the last checkpoint where there is one (the same settings
    # give the same artifact id, so only the killed run's own checkpoints); true: continue, an error
    # without one; false: start afresh, the killed run's checkpoints deleted
    resume: bool | Literal["auto"] = unhashed("auto")
    seed: int = 0  # the trajectories' order, a tiny model's initial weights, the trainer's shuffling


def validate(cfg: Config) -> None:
    check_save_steps("sft", cfg.save_steps)
    if cfg.context == "fold" and cfg.view != "step":
        raise UserError(
            "sft.context=fold: a folded trajectory's steps saw different contexts; set sft.view=step "
            "(each step a sample of the context it saw)"
        )
    if cfg.max_steps < 0:
        raise UserError(
            f"sft.max_steps: expected 0 (from epochs) or a number of optimizer updates, got {cfg.max_steps}"
        )


def run(cfg: Config, ctx: Context):
    validate(cfg)
    fields = {k: v for k, v in INPUTS.items() if getattr(cfg, k)}
    inputs = resolve_inputs(cfg, fields, ctx)
    writer = ctx.writer("sft", cfg, inputs, add_model_input(cfg.model, inputs, INPUTS, ctx))
    if writer.existing:
        return ctx.skipped(writer)
    set_threads(cfg.threads)
    work = work_dir(writer.final)
    resume_from = prepare_work(work, cfg.resume, "sft", process_state())  # before any work: a clear error
    rows = read_jsonl(inputs["data"].path / "trajectories.jsonl", required=("prompt", "turns"))
    random.Random(cfg.seed).shuffle(rows)
    rows = rows[: cfg.limit] if cfg.limit else rows
    protocol = json.loads((inputs["data"].path / "protocol.json").read_text())
    model, tokenizer = _base_model(cfg, inputs, rows)
    from r3rag.core.protocol import Protocol
    from r3rag.training.helpers import require_chat_template

    require_chat_template(Protocol(**protocol), tokenizer, "sft")
    with writer:
        t0 = time.time()
        stats = train_sft(model, tokenizer, rows, cfg, work, ctx, Protocol(**protocol), resume_from)
        writer.started = t0 - stats["train_seconds_before_resume"]  # the killed legs' training counts too
        save_policy(
            stats.pop("model"),
            tokenizer,
            writer.dir,
            protocol,
            f"base:{inputs['base'].id}" if "base" in inputs else model_location(cfg.model, inputs),
        )
        writer.metrics.update({**stats, "trajectories": len(rows)})
    shutil.rmtree(work, ignore_errors=True)
    return ctx.done(writer)


def _base_model(cfg: Config, inputs, rows):
    from r3rag.training import modeling

    if "base" in inputs:  # the miniature's pretrained model (r3rag base)
        tokenizer = modeling.load_tokenizer(inputs["base"].path / "model")
        model = modeling.load_model(inputs["base"].path / "model", dtype="float32")
    elif cfg.model == "tiny":
        if "world" not in inputs:
            raise UserError("sft: model=tiny needs a world artifact (world: world:latest) for its vocabulary")
        if not (inputs["world"].path / "vocab.txt").is_file():
            raise UserError(
                "sft: model=tiny needs a synthetic world (its vocab.txt); for real data set model "
                "to a pretrained model (e.g. model:latest from r3rag import-model)"
            )
        vocab = (inputs["world"].path / "vocab.txt").read_text().split()
        texts = (
            [" ".join(vocab)]
            + [r["prompt"] for r in rows[:2000]]
            + [t["text"] for r in rows[:2000] for t in r["turns"]]
        )
        tokenizer = modeling.train_word_tokenizer(texts)
        model = modeling.tiny_model_from(tokenizer, cfg, min_positions=512)
    else:
        location = _policy_model_dir(model_location(cfg.model, inputs))
        tokenizer = modeling.load_tokenizer(location)
        model = modeling.load_model(location)
    if cfg.lora:
        from r3rag.training.helpers import apply_lora

        model = apply_lora(model, cfg.lora_settings)
    return model, tokenizer


def _policy_model_dir(location: str) -> str:
    """An sft or rl artifact directory (its policy.json) stands for the policy in its `model/`."""
    policy = Path(location)
    return str(policy / "model") if (policy / "policy.json").is_file() else location


def train_sft(model, tokenizer, rows, cfg: Config, work: Path, ctx: Context, protocol=None, resume_from=None) -> dict:
    """Train on `rows`; checkpoints go to `work`/checkpoints, and `resume_from` (a checkpoint there)
    continues a killed run: weights, optimizer, scheduler, RNG and the data order as they were."""
    from datasets import Dataset
    from trl import SFTConfig

    from r3rag.training.helpers import checkpointing_flag, device_flags, save_flags
    from r3rag.training.observe import TrainClock, show_progress
    from r3rag.training.trainers import FastSFTTrainer

    encoded = tokenize_rows(rows, tokenizer, cfg.max_length, protocol, cfg.view, fold=cfg.context == "fold")
    ds = Dataset.from_dict({"input_ids": [e[0] for e in encoded], "labels": [e[1] for e in encoded]})
    args = SFTConfig(
        output_dir=str(Path(work) / "checkpoints"),
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,  # transformers: -1 = from the epochs, N > 0 wins over them
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.lr,
        lr_scheduler_type={"cosine": "cosine", "constant": "constant_with_warmup"}[cfg.lr_schedule],
        warmup_steps=cfg.warmup_ratio,
        weight_decay=cfg.weight_decay,
        logging_steps=20,
        **save_flags(cfg.save_steps),
        report_to=[],
        seed=cfg.seed,
        max_length=cfg.max_length,
        train_sampling_strategy={"by_length": "group_by_length", "random": "random"}[cfg.sampling],
        dataloader_num_workers=0,
        disable_tqdm=False,
        **checkpointing_flag(cfg.gradient_checkpointing),
        **device_flags(cfg.bf16),
    )
    trainer = FastSFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    show_progress(trainer, "sft", ctx.console)
    clock = TrainClock(resume_from, Path(work) / "metrics.jsonl")  # SFT logs none: a checkpoint's record or 0
    trainer.add_callback(clock)
    trainer.resume_from = resume_from  # the epoch order it resumes into (trainers.ReplayableLengthSampler)
    result = trainer.train(resume_from_checkpoint=resume_from)
    n_tokens = sum(len(e[0]) for e in encoded)
    epochs = _epochs_trained(cfg, result.global_step, len(encoded))
    seconds = clock.seconds()  # every leg's training
    return {
        "model": trainer.model,
        "samples": len(encoded),
        "train_loss": round(result.training_loss, 4),
        "tokens_per_epoch": n_tokens,
        "steps": result.global_step,
        "epochs_trained": round(epochs, 4),
        "tokens_per_second": round(n_tokens * epochs / max(seconds, 1e-9), 1),
        "train_seconds": round(seconds, 1),
        "train_seconds_before_resume": round(clock.before, 1),
        "resumed_from_step": step_of(resume_from),
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
    }


def _epochs_trained(cfg: Config, steps: int, n_samples: int) -> float:
    """Passes over the samples: `epochs`, or what `max_steps` updates of `batch_size x grad_accum` cover
    (on one process), so the throughput and a matched control's budget read right."""
    if not cfg.max_steps:
        return cfg.epochs
    return steps * cfg.batch_size * cfg.grad_accum / max(n_samples, 1)
