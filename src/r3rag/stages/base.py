"""`r3rag base`: a small base model pretrained on world text, for a LoRA cold start like real runs.

Real users start from a pretrained model and fine-tune it with LoRA. The miniature mirrors
that: this stage trains a tiny model from scratch as a plain causal LM on text only (the
documents and questions of `worlds` freshly generated worlds, no trajectories), then
`r3rag sft --set base=base:latest --set lora=true` does the cold start on top of it.

The text never comes from the evaluation world, and documents or questions that mention an
entity of its test split are left out: the base model cannot answer held-out questions from
memory, it only knows how the world's language works (as a real model knows English).

A killed run continues from its last checkpoint when rerun with the same settings
(`resume=auto`, the default; `--resume` insists, `resume=false` starts afresh): weights,
optimizer, scheduler, RNG and the data order restored, as `r3rag sft`'s.

Usage:

    r3rag base --set worlds=40 --set epochs=1
    r3rag sft --set base=base:latest --set lora=true --set lr=1e-3
"""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from r3rag.core.artifacts import work_dir
from r3rag.stages.common import Context, process_state, resolve_inputs, set_threads
from r3rag.training.checkpoints import check_save_steps, prepare_work, step_of
from r3rag.util.config import unhashed
from r3rag.util.errors import UserError
from r3rag.util.jsonl import read_jsonl

INPUTS = {"world": "world"}


@dataclass
class Config:
    name: str = "default"  # the artifact's name: runs/base/<name>-<hash>
    world: str = "world:latest"  # its settings and vocabulary; its own text is never trained on
    worlds: int = 40  # fresh worlds whose text is the corpus
    world_clusters: int = 10  # clusters per fresh world
    questions: bool = True  # also the fresh worlds' question texts (no answers, no trajectories)
    arch: str = "llama"  # the fresh model's architecture: llama or qwen2
    layers: int = 4  # transformer layers
    hidden: int = 128  # hidden size
    heads: int = 4  # attention heads (as many key/value heads)
    intermediate: int = 512  # MLP inner size
    max_length: int = 256  # tokens per packed training sequence
    epochs: float = 1.0  # passes over the packed text (fractions allowed)
    lr: float = 1e-3  # peak learning rate (cosine decay)
    batch_size: int = 16  # sequences per step
    warmup_ratio: float = 0.03  # share of the steps the learning rate warms up over
    bf16: bool | str = "auto"  # bf16 autocast: true, false, or auto (where the GPU or CPU computes bf16 natively)
    threads: int = unhashed(0)  # CPU threads for torch (0 = torch's default): how fast, not what is trained
    # checkpoints in runs/base/.work-<id>/ every N optimizer updates (0 = none): what a killed run resumes from
    save_steps: int = unhashed(200)
    resume: bool | Literal["auto"] = unhashed("auto")  # as sft.resume: auto, true (insist) or false (afresh)
    seed: int = 0  # the initial weights and the data order


def validate(cfg: Config) -> None:
    if cfg.worlds < 1:
        raise UserError("base.worlds: needs at least one fresh world")
    if cfg.max_length < 16:
        raise UserError("base.max_length: at least 16 tokens")
    check_save_steps("base", cfg.save_steps)


def run(cfg: Config, ctx: Context):
    validate(cfg)
    inputs = resolve_inputs(cfg, INPUTS, ctx)
    writer = ctx.writer("base", cfg, inputs, INPUTS)
    if writer.existing:
        return ctx.skipped(writer)
    set_threads(cfg.threads)
    work = work_dir(writer.final)
    resume_from = prepare_work(work, cfg.resume, "base", process_state())  # before any work: a clear error
    texts = corpus_texts(cfg, inputs["world"])
    tokenizer, model = _fresh_model(cfg, inputs["world"])
    with writer:
        stats = train_lm(model, tokenizer, texts, cfg, work, resume_from)
        writer.started = time.time() - stats["train_seconds"]  # the killed legs' training counts too
        stats.pop("model").save_pretrained(writer.dir / "model", safe_serialization=True)
        tokenizer.save_pretrained(writer.dir / "model")
        writer.metrics.update({**stats, "texts": len(texts)})
    shutil.rmtree(work, ignore_errors=True)
    return ctx.done(writer)


def corpus_texts(cfg: Config, world_ref) -> list[str]:
    """Documents (and question texts) of fresh worlds, minus anything naming a held-out entity."""
    from r3rag.data.world import chain_names, fresh_world_config, generate_world, world_config_from

    eval_cfg = world_config_from(world_ref.manifest["config"])
    dev = world_ref.path / "dev.jsonl"  # dev entities are held out too: settings are chosen on them
    held_out = chain_names(read_jsonl(world_ref.path / "test.jsonl") + (read_jsonl(dev) if dev.exists() else []))
    texts = []
    for i in range(cfg.worlds):
        world = generate_world(fresh_world_config(eval_cfg, i, cfg.world_clusters))
        texts += [d["text"] for d in world.docs]
        if cfg.questions:
            texts += [q["question"] for q in world.train + world.test]
    kept = [t for t in texts if not _bigrams(t) & held_out]
    random.Random(cfg.seed).shuffle(kept)
    return kept


def _bigrams(text: str) -> set[str]:
    words = text.split()
    return {f"{a} {b}" for a, b in zip(words, words[1:])}


def _fresh_model(cfg: Config, world_ref):
    from r3rag.training import modeling

    vocab = (world_ref.path / "vocab.txt").read_text().split()
    tokenizer = modeling.train_word_tokenizer([" ".join(vocab), "Question :"])
    return tokenizer, modeling.tiny_model_from(tokenizer, cfg, min_positions=1024)


def pack(texts: list[str], tokenizer, length: int) -> list[list[int]]:
    """Texts joined with EOS and cut into sequences of `length` tokens (the last partial one dropped)."""
    stream: list[int] = []
    for t in texts:
        stream += tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id]
    return [stream[i : i + length] for i in range(0, len(stream) - length + 1, length)]


def train_lm(model, tokenizer, texts: list[str], cfg: Config, work: Path, resume_from: str | None = None) -> dict:
    """Train on the packed texts; checkpoints go to `work`/checkpoints, and `resume_from` (one of
    them) continues a killed run."""
    from datasets import Dataset
    from trl import SFTConfig

    from r3rag.training.helpers import checkpointing_flag, device_flags, save_flags
    from r3rag.training.observe import TrainClock, show_progress
    from r3rag.training.trainers import FastSFTTrainer

    seqs = pack(texts, tokenizer, cfg.max_length)
    if not seqs:
        raise UserError(f"base: the fresh worlds' text is shorter than one sequence of {cfg.max_length} tokens")
    ds = Dataset.from_dict({"input_ids": seqs, "labels": seqs})
    args = SFTConfig(
        output_dir=str(Path(work) / "checkpoints"),
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_ratio,
        logging_steps=20,
        **save_flags(cfg.save_steps),
        report_to=[],
        seed=cfg.seed,
        max_length=cfg.max_length,
        dataloader_num_workers=0,
        disable_tqdm=False,
        **checkpointing_flag(False),
        **device_flags(cfg.bf16),
    )
    trainer = FastSFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    show_progress(trainer, "base")
    clock = TrainClock(resume_from, Path(work) / "metrics.jsonl")
    trainer.add_callback(clock)
    result = trainer.train(resume_from_checkpoint=resume_from)
    n_tokens = len(seqs) * cfg.max_length
    seconds = clock.seconds()  # every leg's training
    return {
        "model": trainer.model,
        "train_loss": round(result.training_loss, 4),
        "tokens_per_epoch": n_tokens,
        "steps": result.global_step,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "tokens_per_second": round(n_tokens * cfg.epochs / max(seconds, 1e-9), 1),
        "train_seconds": round(seconds, 1),
        "train_seconds_before_resume": round(clock.before, 1),
        "resumed_from_step": step_of(resume_from),
    }
