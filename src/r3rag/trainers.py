"""Thin subclasses of TRL trainers.

`FastSFTTrainer`: TRL's SFTTrainer always runs its chunked log-prob LM head to also log
entropy and token accuracy; on CPU with a small vocabulary that costs ~30% of a step.
For small vocabularies this computes the same loss (mean NLL over label != -100 tokens)
with one plain cross-entropy, and logs token accuracy from the logits it already has.
Large vocabularies keep TRL's chunked head, which avoids materialising the logits.

`ResumableGRPOTrainer`: TRL's GRPOTrainer whose prompt order survives a resume. TRL's
`RepeatSampler` draws each epoch's order from one generator, advanced once per epoch; a run
resumed in epoch e builds a fresh sampler, which would deal epoch 0's order again (the Trainer
restores the global RNG states, not a sampler's own generator). `EpochReplaySampler` draws
epoch e's order from the seed and e alone, the same orders TRL draws in an unbroken run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Sampler
from trl import GRPOTrainer, SFTTrainer

SMALL_VOCAB = 32_768


class FastSFTTrainer(SFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.config.get_text_config().vocab_size > SMALL_VOCAB:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        labels = inputs["labels"][:, 1:]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        logits = outputs.logits[:, :-1]
        nll = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum")
        valid = labels != -100
        denom = num_items_in_batch if num_items_in_batch is not None else valid.sum()
        loss = nll / torch.as_tensor(denom, device=nll.device).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes
        with torch.no_grad():
            correct = ((logits.argmax(-1) == labels) & valid).sum()
            self._metrics["train" if model.training else "eval"]["mean_token_accuracy"].append(
                (correct / valid.sum().clamp(min=1)).item())
        return (loss, outputs) if return_outputs else loss


class EpochReplaySampler(Sampler):
    """A TRL `RepeatSampler` whose generator is reseeded at each epoch and advanced past the
    orders of the epochs before (one `randperm` each, as `RepeatSampler.__iter__` draws), so
    epoch e deals the same order whether the run got there in one go or resumed into it. The
    Trainer calls `set_epoch` (through accelerate's dataloader) before iterating each epoch."""

    def __init__(self, inner):
        self.inner, self.epoch = inner, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.inner.shuffle and self.inner.seed is not None:
            self.inner.generator.manual_seed(self.inner.seed)
            for _ in range(self.epoch):
                torch.randperm(self.inner.num_samples, generator=self.inner.generator)
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


class ResumableGRPOTrainer(GRPOTrainer):
    def _get_train_sampler(self, dataset=None) -> Sampler:
        return EpochReplaySampler(super()._get_train_sampler(dataset))
