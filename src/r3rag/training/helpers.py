"""Shared training helpers: tokenising trajectories, LoRA, saving policies, trainer device flags.

Usage:
    ids, labels = tokenize_trajectory(traj_json, tokenizer)   # labels -100 off model turns
    ids, labels = tokenize_trajectory(reader_json, tok, 0, Protocol(template="qa"))  # its documents in the prompt
    samples = tokenize_steps(traj_json, tokenizer)            # [(ids, labels)] one per model turn
    encoded = tokenize_rows(rows, tokenizer, max_length, protocol, view="trajectory")  # all at once, batched
    model = maybe_lora(model, LoraSettings(r=16, ...))
    save_policy(model, tokenizer, out_dir, protocol_dict)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from r3rag.core.env import Trajectory, Turn, join_turns
from r3rag.core.protocol import Hit

IGNORE = -100


def completion_with_eos(
    traj: Trajectory, eos_id: int, budget: int = 0, eos_rule: str = "answer"
) -> tuple[list[int], list[int]]:
    """The one span rule for SFT labels and the GRPO env_mask: the joined turns, then EOS.

    Which EOS is a learned model token, by `eos_rule`:
    - "answer" (SFT, teacher text): EOS after an answer, as the chat template's end-of-message
      closes the assistant's reply;
    - "sampled" (RL rollouts, `grpo.rollout_batch`): only an EOS the model itself sampled
      (`traj.eos_sampled`): that id, once, last. A turn the env stopped at `</answer>` never
      sampled one, so the EOS appended for TRL is masked.
    A trajectory that stopped otherwise (turn or token limit, malformed step) still ends in EOS,
    so TRL does not take it for a truncated sample and zero it, but that EOS is masked: nothing
    teaches the model to stop mid-search. `budget` caps the length, EOS kept last (then masked:
    the trajectory was cut).
    """
    if eos_rule not in ("answer", "sampled"):
        raise ValueError(f"eos_rule: expected 'answer' or 'sampled', got {eos_rule!r}")
    ids, mask = join_turns(traj.turns)
    if traj.eos_sampled and ids and ids[-1] == eos_id:  # the generator kept the EOS it sampled: it is the one
        ids, mask = ids[:-1], mask[:-1]
    eos_learned = int(traj.eos_sampled if eos_rule == "sampled" else traj.finish_reason == "answer")
    if budget and len(ids) >= budget:
        ids, mask, eos_learned = ids[: budget - 1], mask[: budget - 1], 0
    return ids + [eos_id], mask + [eos_learned]


def framed_prompt(traj: Trajectory, tokenizer, protocol=None) -> str:
    """The prompt text a trajectory is trained from: the protocol's `context_prompt` for this
    tokenizer (its chat template when `chat`), as RL and eval frame it; the stored prompt when
    no protocol is given. A teacher without this tokenizer (the oracle) stored the plain prompt.
    A `qa` reader's documents (single-shot RAG, gold documents) are part of its prompt: they are
    its trajectory's one recorded search, put back as eval's rag mode renders them."""
    if protocol is None:
        return traj.prompt
    return protocol.context_prompt(traj.question, tokenizer, docs=prompt_docs(traj, protocol))


def prompt_docs(traj: Trajectory, protocol) -> list[Hit] | None:
    """The documents inside a trajectory's prompt: a `qa` reader's first search, None otherwise
    (closed-book, or a protocol whose documents come in environment turns). Documents the loop
    fetched before the first turn are a search no model step asked for: one more than its queries."""
    if not (protocol.docs_in_prompt and len(traj.documents) > len(traj.queries)):
        return None
    return [Hit(d["id"], d.get("score", 0.0), d["title"], d["text"]) for d in traj.documents[0]]


def require_chat_template(protocol, tokenizer, where: str) -> None:
    """A protocol with `chat` needs a tokenizer that has a chat template: one clear line, not a
    silent fallback to the plain prompt (training and evaluation would then frame differently)."""
    if getattr(protocol, "chat", False) and not getattr(tokenizer, "chat_template", None):
        from r3rag.util.errors import UserError

        raise UserError(
            f"{where}: the protocol has chat=true but the tokenizer has no chat template "
            "(use an instruct model's tokenizer, or set chat=false)"
        )


def tokenize_trajectory(row: dict, tokenizer, max_length: int = 0, protocol=None) -> tuple[list[int], list[int]]:
    """Prompt + turns + EOS; loss only on model turns (and EOS after an answer): `completion_with_eos`."""
    traj = Trajectory.from_json(row)
    prompt_ids = tokenizer.encode(framed_prompt(traj, tokenizer, protocol), add_special_tokens=False)
    traj.turns = [Turn(t.role, t.text, tokenizer.encode(t.text, add_special_tokens=False)) for t in traj.turns]
    comp_ids, mask = completion_with_eos(traj, tokenizer.eos_token_id)
    ids = prompt_ids + comp_ids
    labels = [IGNORE] * len(prompt_ids) + [i if m else IGNORE for i, m in zip(comp_ids, mask)]
    if max_length and len(ids) > max_length:
        ids, labels = ids[:max_length], labels[:max_length]
    return ids, labels


def tokenize_steps(
    row: dict, tokenizer, max_length: int = 0, protocol=None, fold: bool = False
) -> list[tuple[list[int], list[int]]]:
    """R3-RAG's view: one sample per model turn, whose prompt is the question, the earlier steps
    and their documents (no loss) and whose completion is that step (loss; EOS after a final answer).
    Too long a sample loses context from the left, never its step. `fold` (`context: fold`): each
    step's prompt is the context the loop showed it, every search's documents but the last one's
    as their stub (r3rag.core.env), so the model learns from the contexts it will see."""
    traj = Trajectory.from_json(row)
    prompt = tokenizer.encode(framed_prompt(traj, tokenizer, protocol), add_special_tokens=False)
    turn_ids = [tokenizer.encode(t.text, add_special_tokens=False) for t in traj.turns]
    stub_ids = (
        {i: tokenizer.encode(text, add_special_tokens=False) for i, text in documents_stubs(traj, protocol).items()}
        if fold
        else {}
    )
    last_model = max(i for i, t in enumerate(traj.turns) if t.role == "model")
    samples = []
    for i, t in enumerate(traj.turns):
        if t.role != "model":
            continue
        shown_in_full = max((j for j in stub_ids if j < i), default=None)  # the last search before this step
        context = list(prompt)
        for j in range(i):
            context += stub_ids[j] if j in stub_ids and j != shown_in_full else turn_ids[j]
        step = turn_ids[i] + ([tokenizer.eos_token_id] if i == last_model and traj.finish_reason == "answer" else [])
        keep = context
        if max_length and len(context) + len(step) > max_length:
            room = max_length - len(step)
            keep, step = (context[-room:], step) if room > 0 else ([], step[:max_length])
        samples.append((keep + step, [IGNORE] * len(keep) + step))
    return samples


def documents_stubs(traj: Trajectory, protocol) -> dict[int, str]:
    """{turn index: its stub text} for each documents turn of a stored trajectory: the env turns
    that render one of its searches (the stubs are rebuilt from `documents`, as the loop wrote them)."""
    rendered = [protocol.render_docs(_hits(docs)) for docs in traj.documents]
    stubs, k = {}, 0
    for i, t in enumerate(traj.turns):
        if t.role == "env" and k < len(rendered) and t.text == rendered[k]:
            stubs[i] = protocol.render_stub(_hits(traj.documents[k]))
            k += 1
    return stubs


def _hits(docs: list[dict]) -> list[Hit]:
    return [Hit(d["id"], d.get("score", 0.0), d["title"], d["text"]) for d in docs]


def tokenize_rows(
    rows: list[dict], tokenizer, max_length: int, protocol, view: str, fold: bool = False
) -> list[tuple[list[int], list[int]]]:
    """tokenize_trajectory (view "trajectory") or tokenize_steps ("step"; `fold`: each step from its
    folded context) of every row, with every text encoded in one batch call first (the fast
    tokenizer's Rust batch path): the same ids as one `encode` per text, without ~230k Python round
    trips (34k demo trajectories: ~30 s -> ~3 s)."""
    texts = []
    for row in rows:
        traj = Trajectory.from_json(row)
        texts += [framed_prompt(traj, tokenizer, protocol), *(t.text for t in traj.turns)]
    cached = PreEncoded(tokenizer, texts)
    if view == "step":
        return [s for r in rows for s in tokenize_steps(r, cached, max_length, protocol, fold)]
    return [tokenize_trajectory(r, cached, max_length, protocol) for r in rows]


class PreEncoded:
    """A tokenizer whose `encode(text, add_special_tokens=False)` answers from one batch encoding
    of `texts`; anything else (other texts, chat templates, ids) goes to the tokenizer itself."""

    def __init__(self, tokenizer, texts: list[str]):
        unique = list(dict.fromkeys(texts))
        backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's Rust one: no per-text wrapping
        if backend is not None:
            ids = [e.ids for e in backend.encode_batch(unique, add_special_tokens=False)]
        else:
            ids = tokenizer(unique, add_special_tokens=False)["input_ids"] if unique else []
        self._tokenizer, self._ids = tokenizer, dict(zip(unique, ids))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not add_special_tokens and text in self._ids:
            return list(self._ids[text])
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@dataclass
class LoraSettings:
    r: int = 16  # rank of each adapter's update matrices
    alpha: int = 32  # the update is scaled by alpha / r
    dropout: float = 0.05  # dropout on the adapters' input
    target_modules: list[str] = field(  # the linear layers that get adapters (Llama / Qwen2 names)
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


def apply_lora(model, s: LoraSettings):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=s.r, lora_alpha=s.alpha, lora_dropout=s.dropout, target_modules=s.target_modules, task_type="CAUSAL_LM"
    )
    return get_peft_model(model, cfg)


def save_policy(model, tokenizer, out: Path, protocol: dict, base: str) -> None:
    """Save merged weights (LoRA folded in) + tokenizer, so any stage loads it like a plain model."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.save_pretrained(out / "model", safe_serialization=True)
    tokenizer.save_pretrained(out / "model")
    (out / "policy.json").write_text(json.dumps({"protocol": protocol, "base": base}, indent=2))


def load_protocol_dict(policy_dir: Path) -> dict:
    return json.loads((policy_dir / "policy.json").read_text())["protocol"]


def checkpointing_flag(enabled: bool) -> dict:
    """The trainer flag for activation checkpointing under this transformers' name for it: later
    5.x releases renamed `gradient_checkpointing` (now a deprecated alias) to `activation_checkpointing`."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def save_flags(save_steps: int, keep: int = 2) -> dict:
    """Trainer flags for the checkpoints a killed run resumes from: every `save_steps` optimizer
    updates (0 = none), the newest `keep` kept (2: the newest, and the one before in case a kill
    cuts the newest short)."""
    return {"save_strategy": "steps" if save_steps else "no", "save_steps": save_steps or 500, "save_total_limit": keep}


def device_flags(bf16: bool | str) -> dict:
    """Trainer flags: CPU when there is no GPU; bf16 autocast where the hardware has it ("auto") or as asked."""
    import torch  # here, not at the top: stage modules import this one, and `r3rag <stage> --help` its stage

    from r3rag.util.errors import UserError

    cuda = torch.cuda.is_available()
    if bf16 == "auto":
        bf16 = torch.cuda.is_bf16_supported() if cuda else cpu_has_bf16()
    if not isinstance(bf16, bool):
        raise UserError(f"bf16: expected true, false or auto, got {bf16!r}")
    return {"use_cpu": not cuda, "bf16": bf16}


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX). Without them torch emulates
    bf16 and autocast is slower than fp32, not faster: one SmolLM2-135M step on 2 x 512 tokens took
    469 s under bf16 autocast against 19 s in fp32 on a 2-core AVX2 EPYC. torch only exposes the check
    privately (torch.cpu._is_avx512_bf16_supported, _is_amx_tile_supported; tests/test_training.py
    names them), so a torch without them counts as "no"."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
