"""Thin subclasses of TRL trainers.

`FastSFTTrainer`: TRL's SFTTrainer always runs its chunked log-prob LM head to also log
entropy and token accuracy; on CPU with a small vocabulary that costs ~30% of a step.
For small vocabularies this computes the same loss (mean NLL over label != -100 tokens)
with one plain cross-entropy, and logs token accuracy from the logits it already has.
Large vocabularies keep TRL's chunked head, which avoids materialising the logits. Its
length-grouped sampler (`ReplayableLengthSampler`) keeps in each checkpoint the RNG state its
epoch's order came from, so a resumed SFT run sees the orders an unbroken run sees.
tests/test_training.py checks that its loss equals TRL's SFTTrainer loss on a padded batch.

`ResumableGRPOTrainer`: TRL's GRPOTrainer whose prompt order survives a resume, and which
scores log-probs without padding waste. TRL pads a whole generation batch to its longest
prompt (left) and completion (right) and runs every micro-batch at that width; multi-turn
completions vary a lot (the replication's: ~120 tokens on average, ~200 at most), so on a CPU
~40% of a step's forward and backward went to padding. `_get_per_token_logps_and_entropies`
sorts the rows by length, cuts them into groups of `LOGPS_ROWS`, trims each group's all-padding
columns and calls TRL's own method on it; the values (padding scores 0, as TRL's) and
gradients are TRL's up to float rounding (RoPE attention depends on relative positions only;
tests/test_training.py compares them). TRL's
`RepeatSampler` draws each epoch's order from one generator, advanced once per epoch; a run
resumed in epoch e builds a fresh sampler, which would deal epoch 0's order again (the Trainer
restores the global RNG states, not a sampler's own generator). `EpochReplaySampler` draws
epoch e's order from the seed and e alone, the same orders TRL draws in an unbroken run.
Its loss scores the model's own tokens only: retrieved tokens (`tool_mask` 0) get no loss, so
`_compute_loss` gives their labels -100 and TRL's fused LM head leaves them out (a real model's
documents are most of a trajectory's completion, each a 49k-way softmax for nothing). The
old, reference and sampling log-probs are set to 0 there as the new ones are, so every ratio
and KL term at those positions is exactly 1 and 0 before the mask zeroes it anyway. TRL
scores only the labelled positions on Triton devices and every position elsewhere (to keep
tile shapes fixed for compilers); on a CPU it scores the labelled ones too (`_compact_on_cpu`).

`R3ragGRPOTrainer`: the resumable trainer `r3rag rl` builds, plus three things:
- `extra_logs`: values merged into the next log line (the dev evaluation a callback runs
  between a step's end and that step's log), so metrics.jsonl, TensorBoard and W&B get them.
- per-step credit (`step_credit_weight` W > 0, `rl.process_credit=step`): the rollout function
  returns `step_credit`, per completion the [start, end, x] token spans of its search steps and
  their process rewards; `step_advantages` normalises them within each prompt's group and adds
  them to TRL's per-trajectory advantage on those tokens only. TRL has no public hook for
  per-token advantages, so this overrides the internal `GRPOTrainer._generate_and_score_completions`
  (its output's `advantages`, shape (B,)) and relies on `_compute_loss` taking a (B, T)
  `advantages` (TRL's comment there says subclasses may provide one);
  tests/test_rl_dynamics.py checks both against the installed TRL. Environment tokens keep
  `tool_mask` 0: whatever their advantage, they get no loss.
- hooks for what r3rag.rl builds on it: `_advantages` (r3rag.rl.ppo's estimators replace GRPO's
  there) and `expand_rows` (`context: fold`: each folded trajectory's rows, r3rag.rl.fold_rows).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Sampler
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices
from trl import GRPOTrainer, SFTTrainer
from trl.trainer import utils as trl_utils

SMALL_VOCAB = 32_768
LOGPS_ROWS = 32  # rows per forward pass once sorted by length (benchmarks/grpo_padding.py)
PLAIN_KWARGS = {"batch_size", "compute_entropy", "compute_aux_loss"}
# per-row token spans (r3rag.rl.batch) and a folded trajectory's rows (r3rag.rl.fold_rows) the rollout function returns
ROW_FIELDS = ("step_credit", "turn_spans", "fold_rows")


class FastSFTTrainer(SFTTrainer):
    resume_from: str | None = None  # the checkpoint train(resume_from_checkpoint=...) is given

    def _get_train_sampler(self, train_dataset=None) -> Sampler | None:
        sampler = super()._get_train_sampler(train_dataset)
        if isinstance(sampler, LengthGroupedSampler):  # train_sampling_strategy="group_by_length"
            sampler = self._length_sampler = ReplayableLengthSampler(sampler.lengths, sampler.batch_size)
            if self.resume_from:
                sampler.replay_from(Path(self.resume_from))
        return sampler

    def _save_rng_state(self, output_dir: str) -> None:  # part of each checkpoint
        super()._save_rng_state(output_dir)
        if getattr(self, "_length_sampler", None) is not None and self.is_world_process_zero():
            self._length_sampler.save(Path(output_dir))

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
                (correct / valid.sum().clamp(min=1)).item()
            )
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


class ReplayableLengthSampler(LengthGroupedSampler):
    """transformers' `LengthGroupedSampler` (it deals each epoch's order from the global RNG, as
    the stock one does) that remembers the RNG state the current epoch's order came from. The
    Trainer restores the global RNG to the checkpoint's state only after it dealt the epoch a run
    resumes into, so that epoch would get another order than an unbroken run's: `save` writes
    the state into the checkpoint and `replay_from` makes that epoch draw from it again."""

    FILE = "r3rag_epoch_order.pt"

    def __init__(self, lengths: list[int], batch_size: int):
        super().__init__(batch_size, lengths=lengths)
        self.epoch, self.drawn_from, self.replay = 0, None, None

    def set_epoch(self, epoch: int) -> None:  # the Trainer calls it (through accelerate) before each epoch
        self.epoch = epoch

    def __iter__(self):
        if self.replay is None or self.replay["epoch"] != self.epoch:
            self.drawn_from = {"epoch": self.epoch, "state": torch.get_rng_state()}
            return super().__iter__()  # from the global RNG, advancing it as the stock sampler does
        self.drawn_from, self.replay = self.replay, None
        generator = torch.Generator()
        generator.set_state(self.drawn_from["state"])
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))

    def save(self, checkpoint: Path) -> None:
        if self.drawn_from is not None:
            torch.save(self.drawn_from, checkpoint / self.FILE)

    def replay_from(self, checkpoint: Path) -> None:
        """Deal the checkpoint's epoch in the order it had (a checkpoint without the file: as drawn)."""
        if (checkpoint / self.FILE).is_file():
            self.replay = torch.load(checkpoint / self.FILE, weights_only=True)


def _compact_on_cpu(use_triton):
    """TRL's choice of scoring only labelled positions, extended to the CPU (no compiler there)."""

    def compact(device) -> bool:
        return use_triton(device) or device.type == "cpu"

    compact.trl_use_triton = use_triton
    return compact


if not hasattr(trl_utils._use_triton, "trl_use_triton"):  # once per process
    trl_utils._use_triton = _compact_on_cpu(trl_utils._use_triton)
SKIPPED_LOGPS = ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps")
# TRL's loss types whose rows with advantage 0 can leave the loss's pass (_rows_with_signal), and the
# text-only inputs it slices by row (anything else, images say, keeps every row)
ROW_MEAN_LOSSES = {"grpo", "sapo", "dr_grpo", "luspo"}
DROPPABLE_LOSSES = ROW_MEAN_LOSSES | {"dapo", "cispo", "bnpo"}
TEXT_INPUTS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "advantages"}
TEXT_INPUTS |= {"num_items_in_batch", "importance_sampling_ratio", *SKIPPED_LOGPS}


def own_token_mask(inputs: dict) -> torch.Tensor:
    """1 at the model's own completion tokens of a TRL batch, 0 at padding and retrieved ones: the
    tokens every loss reads (TRL's `completion_mask * tool_mask`)."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def _own_tokens(inputs: dict) -> torch.Tensor:
    return own_token_mask(inputs).sum().clamp(min=1.0)


class ResumableGRPOTrainer(GRPOTrainer):
    skip_retrieved = True  # the loss's LM head leaves retrieved tokens out (benchmarks/real_model.py: both)
    skip_zero_advantage = True  # rows whose advantage is 0 at every token skip the loss's pass (_rows_with_signal)
    _score_mask: torch.Tensor | None = None  # (rows, completion width): 0 where no loss reads a log-prob

    def _get_train_sampler(self, dataset=None) -> Sampler:
        return EpochReplaySampler(super()._get_train_sampler(dataset))

    def _compute_loss(self, model, inputs):
        inputs, scale = self._rows_with_signal(inputs)
        loss = self._loss_over_own_tokens(model, inputs)
        return loss if scale == 1.0 else loss * scale

    def _rows_with_signal(self, inputs) -> tuple[dict, float]:
        """(the micro-batch without its rows whose advantage is 0 at every token, the factor that
        gives the loss TRL gives on every row). When the advantage-weighted term is the loss's only
        one (no KL term, no entropy bonus, no entropy quantile), such a row's loss is -min(r 0, clip(r) 0)
        = 0 with a zero gradient, so its forward and backward are pure cost: a GRPO group whose
        samples all scored alike is one (most groups of a weak cold start, issue 47). The token-sum
        losses (dapo, cispo) divide by the generation batch's token count TRL passes in, unchanged;
        the row means (grpo, sapo, dr_grpo, luspo) are scaled by rows kept / rows, bnpo by tokens
        kept / tokens. TRL's entropy and clip-ratio logs then cover the rows kept. A micro-batch
        with no such row keeps its shortest one (loss 0): every process's backward still reaches
        every parameter, as DDP needs."""
        adv = inputs["advantages"]
        zero = adv.eq(0) if adv.dim() == 1 else adv.eq(0).all(1)
        keep, rows = ~zero, len(adv)
        if not (self.skip_zero_advantage and bool(zero.any()) and self._rows_droppable(inputs)):
            keep[:] = True
        elif not bool(keep.any()):
            keep[(inputs["prompt_mask"].sum(1) + inputs["completion_mask"].sum(1)).argmin()] = True
        if self.model.training:  # the share of rows the loss's pass scored: what the skip saved
            self._metrics["train"]["loss/rows_scored"].append(float(keep.float().mean()))
        if bool(keep.all()):
            return inputs, 1.0
        kept = {k: v[keep] if torch.is_tensor(v) and v.dim() and len(v) == rows else v for k, v in inputs.items()}
        if self.loss_type == "bnpo":
            return kept, (_own_tokens(kept) / _own_tokens(inputs)).item()
        return kept, int(keep.sum()) / rows if self.loss_type in ROW_MEAN_LOSSES else 1.0

    def _rows_droppable(self, inputs) -> bool:
        plain = self.beta == 0.0 and not self._entropy_bonus_enabled and self.top_entropy_quantile >= 1.0
        return plain and not self.aux_loss_enabled and self.loss_type in DROPPABLE_LOSSES and set(inputs) <= TEXT_INPUTS

    def _loss_over_own_tokens(self, model, inputs):
        own = inputs.get("tool_mask")  # 1: the model's token, 0: retrieved
        if own is None or not self.skip_retrieved or bool(own.all()):
            return super()._compute_loss(model, inputs)
        inputs = {**inputs, **{k: inputs[k].masked_fill(own == 0, 0.0) for k in SKIPPED_LOGPS if k in inputs}}
        self._score_mask = own
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._score_mask = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        score = super()._get_per_token_logps_and_entropies
        text_only = not args and all(v is None for k, v in kwargs.items() if k not in PLAIN_KWARGS)
        if not text_only or kwargs.get("compute_aux_loss"):  # images, MoE: TRL's call as it is
            return score(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        skip = self._score_mask
        if skip is not None and tuple(skip.shape) == (len(input_ids), logits_to_keep):
            kwargs["scored"] = skip
            score = self._score_kept_tokens
        rows = min(kwargs.pop("batch_size", None) or len(input_ids), LOGPS_ROWS)
        order = attention_mask.sum(1).argsort(stable=True)
        parts = [
            _trimmed(score, model, input_ids[i], attention_mask[i], logits_to_keep, _rows_of(kwargs, i))
            for i in order.split(rows)
        ]
        back = order.argsort()
        logps = torch.cat([p[0] for p in parts])[back]
        entropy = torch.cat([p[1] for p in parts])[back] if parts[0][1] is not None else None
        return logps, entropy, None

    def _score_kept_tokens(self, model, ids, attention, width, scored, compute_entropy=False, **_):
        """TRL's text-only scoring (GRPOTrainer._get_per_token_logps_and_entropies) with the labels
        of the completion tokens `scored` marks 0 set to -100: the fused LM head scores them 0."""
        labels = ids.masked_fill(attention == 0, -100)
        labels[:, :-width] = -100
        labels[:, -width:] = labels[:, -width:].masked_fill(scored[:, :width] == 0, -100)
        with self.accelerator.autocast():
            out = model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -width:], out.entropy[:, -width:] if compute_entropy else None, None


def _rows_of(kwargs: dict, rows: torch.Tensor) -> dict:
    return {**kwargs, "scored": kwargs["scored"][rows]} if "scored" in kwargs else kwargs


class R3ragGRPOTrainer(ResumableGRPOTrainer):
    def __init__(self, *args, step_credit_weight: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra_logs: dict[str, float] = {}
        self.step_credit_weight = step_credit_weight
        self.row_extras: dict[str, list] = {}  # this process's rows' token spans (ROW_FIELDS), last rollout
        self.expand_rows = None  # context: fold: r3rag.rl.fold_rows.expand, which r3rag.rl.grpo sets
        if self.rollout_func is not None:
            inner = self.rollout_func

            def keep_spans(prompts, trainer):  # the spans stay here: they are not a reward function's input
                out = inner(prompts, trainer)
                self.row_extras = {k: out.pop(k) for k in ROW_FIELDS if k in out}
                return out

            self.rollout_func = keep_spans

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs.update(self.extra_logs)
        self.extra_logs.clear()
        super().log(logs, start_time)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return out
        if self.row_extras.get("fold_rows"):  # context: fold: one row per model turn, then their advantages
            out = self.expand_rows(self, out, self.row_extras["fold_rows"])
        return self._advantages(out, inputs)

    def _advantages(self, out: dict, inputs) -> dict:
        """The batch with its advantages: GRPO's from TRL, plus per-step credit where it is on
        (r3rag.rl.ppo's trainer puts its algorithm's here instead)."""
        if not self.step_credit_weight:
            return out
        from accelerate.utils import gather_object

        spans = gather_object(
            self.row_extras.get("step_credit", [])
        )  # groups may span processes: normalise over the whole batch
        adv = step_advantages(
            spans, out["completion_ids"].shape[1], self.num_generations, self.step_credit_weight, self.scale_rewards
        )
        rank = self.accelerator.process_index
        local = adv[rank * len(inputs) : (rank + 1) * len(inputs)].to(out["advantages"])
        out["advantages"] = out["advantages"].unsqueeze(1) + local
        return out


def step_advantages(spans: list[list], width: int, group: int, weight: float, scale: str) -> torch.Tensor:
    """Per-token process advantages, (len(spans), width), for a whole batch in TRL's order.

    `spans[i]`: [start, end, x] for each credited step of completion i: tokens [start, end) of its
    completion, x its weighted process reward. Within each group of `group` consecutive
    completions (one prompt's), every step's y = x / W (W = `weight`, the process components'
    summed weight) is centred on the mean over the group's steps, divided by their std (the
    batch's steps' with scale "batch", nothing with "none") as GRPO does rewards (DeepSeekMath's
    process supervision), and scaled back by W so the weights set how much the process counts
    next to the outcome. A step's tokens get its value; all other tokens 0."""
    out = torch.zeros(len(spans), width)
    ys = [[x / weight for *_, x in s] for s in spans]
    batch_std = _std([y for row in ys for y in row])
    for g in range(0, len(spans), group):
        vals = [y for row in ys[g : g + group] for y in row]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        std = {"group": _std(vals), "batch": batch_std}.get(scale)
        for i in range(g, min(g + group, len(spans))):
            for (start, end, _), y in zip(spans[i], ys[i]):
                centred = y - mean
                out[i, start:end] = weight * (centred if std is None else centred / (std + 1e-4))
    return out


def _std(values: list[float]) -> float:
    """Sample std as TRL computes it for rewards; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    return torch.tensor(values, dtype=torch.float64).std().item()


def _trimmed(score, model, ids, mask, keep: int, kwargs: dict):
    """TRL's log-probs for one group of rows, on the columns where any row has a real token;
    the trimmed completion columns come back as 0, as TRL scores padding."""
    width = ids.size(1)
    real = mask.any(0).nonzero().squeeze(1)
    first = min(int(real[0]), width - keep)  # never into the completion
    last = max(int(real[-1]) + 1, width - keep + 1)  # at least one completion column
    kept = last - (width - keep)
    logps, entropy, _ = score(model, ids[:, first:last], mask[:, first:last], kept, **kwargs)
    pad = (0, keep - kept)
    return F.pad(logps, pad), None if entropy is None else F.pad(entropy, pad)
