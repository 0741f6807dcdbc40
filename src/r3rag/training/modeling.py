"""Models and tokenizers: a tiny model built from a config with a word-level tokenizer
trained in-process, or any transformers model (hub id or local path).

Usage:
    tok = train_word_tokenizer(texts)                 # closed-vocabulary worlds
    model = tiny_model(tok, arch="llama", layers=4, hidden=128)
    model, tok = load_pretrained("Qwen/Qwen2.5-3B")   # or a local directory
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from r3rag.core.protocol import TAGS
from r3rag.util.errors import UserError

SPECIALS = ["<pad>", "<unk>", "<eos>"]


def train_word_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """One token per word or punctuation mark; the protocol tags are single tokens.

    A closed world vocabulary means every name piece is one token, so a tiny model can
    copy an unseen name from a retrieved document into its next query.
    """
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=1, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    fast.add_tokens(list(TAGS))
    return fast


def tiny_model(
    tokenizer,
    arch: str = "llama",
    layers: int = 4,
    hidden: int = 128,
    heads: int = 4,
    intermediate: int = 512,
    max_positions: int = 1024,
    seed: int = 0,
):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    match arch:
        case "llama":
            config = LlamaConfig(**common)
        case "qwen2":
            config = Qwen2Config(**common)
        case _:
            raise UserError(f"unknown tiny model arch {arch!r} (expected llama or qwen2)")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def tiny_model_from(tokenizer, cfg, min_positions: int):
    """tiny_model with a stage config's shape fields (arch, layers, hidden, heads, intermediate,
    seed), positions for at least max(cfg.max_length, min_positions) tokens: `base` and `sft`."""
    shape = (cfg.arch, cfg.layers, cfg.hidden, cfg.heads, cfg.intermediate)
    return tiny_model(tokenizer, *shape, max_positions=max(cfg.max_length, min_positions), seed=cfg.seed)


def _check_local_path(name_or_path: str | Path) -> None:
    """A hub id is "name" or "org/name"; anything else is a path and must exist."""
    name = str(name_or_path)
    looks_like_path = name.startswith(("/", ".", "~")) or name.count("/") > 1
    if looks_like_path and not Path(name).expanduser().exists():
        raise UserError(f"model path {name!r} does not exist")


def load_tokenizer(name_or_path: str | Path):
    _check_local_path(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(str(name_or_path))
    except (OSError, ValueError) as e:
        raise UserError(f"could not load tokenizer {str(name_or_path)!r}: {str(e).splitlines()[0]}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str | Path, dtype: str = "auto"):
    _check_local_path(name_or_path)
    torch_dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype
    ]
    try:
        return AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=torch_dtype)
    except (OSError, ValueError) as e:
        raise UserError(f"could not load model {str(name_or_path)!r}: {str(e).splitlines()[0]}") from None


def load_policy(path: Path):
    """A policy saved by the sft or rl stage: merged weights + tokenizer in `path/model`."""
    model = load_model(path / "model", dtype="float32")
    model.eval()
    return model, load_tokenizer(path / "model")
