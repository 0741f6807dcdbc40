"""PPO's critic: the policy's starting weights under a fresh one-output head, as both seed papers
build it (Search-R1 on veRL: `AutoModelForTokenClassification(num_labels=1)` from the actor's
checkpoint; R3-RAG on OpenRLHF: the SFT policy with a re-initialised value head).

- `build_critic(policy)`: transformers' token-classification model of the policy's architecture,
  its backbone loaded from the policy's (a LoRA policy's base weights, the adapters left out), its
  `score` head fresh. A LoRA policy gets a LoRA critic of the same shape (head fully trained).
- `critic_values`: V(s_t) for each completion token t, read from the hidden state before it
  (veRL's `values[:, -T-1:-1]`): the value of the prefix the token is sampled from.
- `save_critic` / `load_critic`: the critic's trained weights and its optimizer's state in one
  file of a checkpoint, so `--resume` continues the critic as the Trainer continues the policy.

The critic never reaches vLLM: it is not the trainer's model, and TRL syncs only that.

Usage:
    critic = build_critic(policy)
    values = critic_values(critic, input_ids, attention_mask, completion_width)   # (B, T)
    save_critic(critic, optimizer, checkpoint_dir); load_critic(critic, optimizer, checkpoint_dir)
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from r3rag.util.errors import UserError

FILE = "critic.pt"


def build_critic(policy):
    """A critic initialised from `policy`'s current weights (call it before training moves them)."""
    from transformers import AutoModelForTokenClassification

    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    config = copy.deepcopy(base.config)
    config.num_labels = 1
    dtype = next(base.parameters()).dtype
    critic = AutoModelForTokenClassification.from_config(config, dtype=dtype)
    backbone = getattr(base, base.base_model_prefix).state_dict()
    # a LoRA policy's layers hold the starting weight as `<name>.base_layer.weight` beside the adapters
    weights = {k.replace(".base_layer", ""): v for k, v in backbone.items() if "lora_" not in k}
    getattr(critic, critic.base_model_prefix).load_state_dict(weights)
    critic.to(next(base.parameters()).device)
    lora = getattr(policy, "peft_config", None)
    return _with_lora(critic, lora["default"]) if lora else critic


def _with_lora(critic, policy_lora):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=policy_lora.r,
        lora_alpha=policy_lora.lora_alpha,
        lora_dropout=policy_lora.lora_dropout,
        target_modules=policy_lora.target_modules,
        modules_to_save=["score"],  # the fresh head is trained whole
        task_type="TOKEN_CLS",
    )
    return get_peft_model(critic, cfg)


def critic_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) values of the last `width` positions' prefixes: the head's output at the
    position before each completion token (the state the token was sampled in), in float32."""
    logits = critic(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logits[:, -width - 1 : -1, 0].float()


def trained_parameters(critic) -> dict[str, torch.nn.Parameter]:
    inner = critic.module if hasattr(critic, "module") else critic  # DDP's wrapper
    return {n: p for n, p in inner.named_parameters() if p.requires_grad}


def save_critic(critic, optimizer, checkpoint: Path) -> None:
    checkpoint.mkdir(parents=True, exist_ok=True)
    weights = {n: p.detach().cpu() for n, p in trained_parameters(critic).items()}
    tmp = checkpoint / f"{FILE}.tmp"
    torch.save({"weights": weights, "optimizer": optimizer.state_dict()}, tmp)
    tmp.replace(checkpoint / FILE)


def load_critic(critic, optimizer, checkpoint: Path) -> None:
    path = Path(checkpoint) / FILE
    if not path.is_file():
        raise UserError(
            f"{path}: missing: this checkpoint has no critic to resume PPO from (resume=false starts afresh)"
        )
    state = torch.load(path, weights_only=True, map_location="cpu")
    params = trained_parameters(critic)
    if set(state["weights"]) != set(params):
        raise UserError(f"{path}: its critic's parameters do not match this run's critic (another model or LoRA shape)")
    with torch.no_grad():
        for name, value in state["weights"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
