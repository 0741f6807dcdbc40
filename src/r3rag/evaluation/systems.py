"""Systems to evaluate: what answers the questions, behind the rollout loop's Generator interface.

A system is a policy plus a mode (`iterative`: the protocol loop; `rag`: retrieve top-k with
the question, answer once; `direct`: answer with no retrieval). The policy is one of:

- a policy artifact written by `r3rag sft` / `r3rag rl` (`sft:latest`, `runs/rl/...`): its
  own tokenizer and the protocol it was trained with;
- any transformers causal LM (hub id or local directory): prompted with the protocol's
  instruction (`template`), inside its chat template when it has one (`chat`), as Search-R1
  and IRCoT-style baselines prompt instruct models. Reader baselines use `template: qa`
  (closed-book with `mode: direct`; single-shot RAG with `mode: rag`, the top_k documents in
  the user message; `mode: gold`, the question's gold documents instead, r3rag.data.gold: the
  oracle reader); `protocol: ircot` (mode iterative) is IRCoT's interleaved loop: one
  reasoning sentence per turn, each the next retrieval query;
- an OpenAI-compatible endpoint (`endpoint` = base URL, `model` = served model name, API key
  from the environment variable named by `api_key_env`);
- a scripted baseline (`scripted: top-title`: search the question, answer the top document's
  title), a fixed reference policy whose numbers can be checked by hand.

Usage (pipeline YAML, eval section):
    models:
      qwen-iter: {model: Qwen/Qwen2.5-7B-Instruct, mode: iterative}
      deepseek:  {endpoint: https://api.deepseek.com/v1, model: deepseek-chat, api_key_env: DEEPSEEK_API_KEY}
      top-title: {scripted: top-title}
      closed-book: {model: HuggingFaceTB/SmolLM2-135M-Instruct, template: qa, mode: direct}
      rag5:      {model: HuggingFaceTB/SmolLM2-135M-Instruct, template: qa, mode: rag, top_k: 5}
      ircot:     {model: HuggingFaceTB/SmolLM2-135M-Instruct, protocol: ircot, mode: iterative}
    systems: [rag, sft, qwen-iter, top-title, closed-book, rag5, ircot]

`top_k` (0 = eval's top_k) is the system's retrieval depth, so one eval compares rag3 and rag5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from r3rag.core.protocol import DOC_STYLES, PROTOCOLS, TEMPLATES, Protocol, ProtocolSettings
from r3rag.generation.endpoint import EndpointSettings
from r3rag.util.errors import UserError

SCRIPTS = ("top-title",)
MODES = ("iterative", "direct", "rag", "gold")


@dataclass
class SystemSpec(ProtocolSettings, EndpointSettings):
    """One system's settings (`eval.models.<name>`). From the bases: protocol, template, doc_style,
    max_doc_chars (r3rag.core.protocol: for models that are not policies) and endpoint (the system is that
    endpoint), api_key_env (r3rag.generation.endpoint)."""

    model: str = ""  # policy artifact, transformers path / hub id, or (with endpoint) the served model name
    scripted: str = ""  # a scripted baseline: top-title
    mode: Literal["iterative", "direct", "rag", "gold"] = "iterative"  # gold: rag with the gold documents
    top_k: int = 0  # documents per search; 0 = eval's top_k
    chat: bool = True  # use the tokenizer's chat template when it has one (models that are not policies)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: the checkpoint's; vLLM on the CPU: fp32)
    request_params: dict = field(default_factory=dict)  # endpoint: extra chat-completions fields


@dataclass
class System:
    label: str
    mode: str
    protocol: Protocol
    make_generator: object  # (temperature, seed) -> Generator
    tokenizer: object = None
    top_k: int = 0  # documents per search; 0 = eval's top_k


def is_policy_artifact(ref: str) -> bool:
    """`sft:...` / `rl:...` refs, or a directory that holds a policy (policy.json)."""
    return ref.startswith(("sft:", "rl:")) or (Path(ref) / "policy.json").is_file()


def check_spec(label: str, spec: SystemSpec) -> None:
    kinds = [k for k in ("endpoint", "scripted") if getattr(spec, k)]
    if len(kinds) > 1:
        raise UserError(f"eval.models.{label}: set one of endpoint or scripted, not both")
    if spec.scripted and spec.scripted not in SCRIPTS:
        raise UserError(
            f"eval.models.{label}.scripted: unknown script {spec.scripted!r} (available: {', '.join(SCRIPTS)})"
        )
    if not spec.scripted and not spec.model:
        raise UserError(f"eval.models.{label}: set model (a policy artifact, a transformers path or hub id)")
    if spec.scripted and spec.mode != "iterative":
        raise UserError(f"eval.models.{label}: a scripted system runs in mode iterative")
    _check_choices(label, spec)
    if spec.protocol == "ircot" and spec.mode != "iterative":
        raise UserError(f"eval.models.{label}: protocol ircot runs in mode iterative (got {spec.mode!r})")
    if spec.endpoint and spec.template == "qa" and spec.mode in ("rag", "gold"):
        # the chat generator rebuilds the prompt from the question alone: the documents would be lost
        raise UserError(f"eval.models.{label}: template qa with mode rag is not supported for endpoints")
    if spec.max_doc_chars < 0:
        raise UserError(f"eval.models.{label}.max_doc_chars: must be 0 (whole documents) or more")
    if spec.top_k < 0:
        raise UserError(f"eval.models.{label}.top_k: must be 0 (eval's top_k) or more, got {spec.top_k}")


def _check_choices(label: str, spec: SystemSpec) -> None:
    """A misspelled choice is one line naming the allowed values (specs built in code skip the config's check)."""
    for key, allowed in (("mode", MODES), ("template", TEMPLATES), ("doc_style", DOC_STYLES), ("protocol", PROTOCOLS)):
        value = getattr(spec, key)
        if value not in allowed:
            raise UserError(f"eval.models.{label}.{key}: unknown {key} {value!r} (allowed: {', '.join(allowed)})")


def load_system(
    label: str,
    spec: SystemSpec,
    policy_path: Path | None,
    batch_size: int,
    static_cache: bool = False,
    backend: str = "transformers",
    engines=None,
) -> System:
    """`policy_path`: the resolved artifact when `spec.model` is a policy artifact. `backend`:
    transformers, or vllm (a vLLM engine loads the same weights; `engines`, an
    `r3rag.generation.vllm.EnginePool`, starts each set of weights once)."""
    check_spec(label, spec)
    system = _build_system(label, spec, policy_path, batch_size, static_cache, backend, engines)
    system.top_k = spec.top_k
    return system


def _build_system(
    label: str,
    spec: SystemSpec,
    policy_path: Path | None,
    batch_size: int,
    static_cache: bool,
    backend: str,
    engines,
) -> System:
    if spec.scripted:
        protocol = Protocol(name=spec.protocol, template=spec.template, doc_style=spec.doc_style)
        return System(label, spec.mode, protocol, lambda temperature, seed: top_title_generator(protocol))
    if spec.endpoint:
        return _endpoint_system(label, spec)
    if backend == "vllm":
        return _vllm_system(label, spec, policy_path, engines)
    from r3rag.generation.hf import HFGenerator
    from r3rag.training.modeling import load_model, load_policy, load_tokenizer

    if policy_path is not None:
        model, tokenizer = load_policy(policy_path)
    else:
        tokenizer = load_tokenizer(spec.model)
        model = load_model(spec.model, dtype=spec.dtype)
        model.eval()
    protocol = _protocol(spec, policy_path)

    def make(temperature: float, seed: int):
        import torch

        torch.manual_seed(seed)  # sampling draws from torch's generator
        return HFGenerator(model, tokenizer, batch_size=batch_size, temperature=temperature, static_cache=static_cache)

    return System(label, spec.mode, protocol, make, tokenizer)


def _protocol(spec: SystemSpec, policy_path: Path | None) -> Protocol:
    """A policy's own protocol, or the spec's prompt for any other model."""
    from r3rag.training.helpers import load_protocol_dict

    if policy_path is not None:
        return Protocol(**load_protocol_dict(policy_path))
    return spec.to_protocol()


def weights_source(spec: SystemSpec, policy_path: Path | None) -> str:
    """Where a model system's weights are: a policy artifact's `model/`, else `spec.model`."""
    return str(policy_path / "model") if policy_path is not None else spec.model


def _vllm_system(label: str, spec: SystemSpec, policy_path: Path | None, engines) -> System:
    from r3rag.generation.vllm import EnginePool, LLMGenerator, require_vllm
    from r3rag.training.modeling import load_tokenizer

    require_vllm("eval.backend=vllm")
    source = weights_source(spec, policy_path)
    tokenizer = load_tokenizer(source)
    llm = (engines or EnginePool()).get(source, spec.dtype)
    return System(
        label,
        spec.mode,
        _protocol(spec, policy_path),
        lambda temperature, seed: LLMGenerator(llm, tokenizer, temperature, seed=seed),
        tokenizer,
    )


def _endpoint_system(label: str, spec: SystemSpec) -> System:
    from r3rag.generation.openai_chat import ChatGenerator

    protocol = Protocol(name=spec.protocol, template=spec.template, doc_style=spec.doc_style)

    def make(temperature: float, seed: int):
        client = spec.client(f"eval.models.{label}", **spec.request_params)
        return ChatGenerator(client, protocol, temperature=temperature, seed=seed)

    return System(label, spec.mode, protocol, make)


def top_title_generator(protocol: Protocol):
    """Search the question; answer with the top retrieved document's title."""
    from r3rag.generation.scripted import ScriptedGenerator

    def script(traj) -> str:
        if not traj.documents:
            return protocol.search_turn(traj.question)
        top = traj.documents[-1]
        return protocol.answer_turn(top[0]["title"] if top else "unknown")

    return ScriptedGenerator(script)
