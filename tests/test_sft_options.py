"""Two SFT settings whose defaults leave every existing artifact id alone: `sft.lr_schedule` (after
warmup the learning rate decays to 0, cosine, or stays at `lr`, constant) and `sft.sampling` (batches
of similar lengths, by_length, or any mix, random)."""

import pytest

from r3rag.experiments.pipeline import run_stage
from r3rag.util.config import hashed_settings

TINY_SFT = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "bf16=false", "lr=1e-2", "batch_size=4"]


@pytest.fixture(scope="module")
def runs(teacher_runs):
    return teacher_runs


def test_the_default_schedule_leaves_the_hash_alone():
    from r3rag.stages import sft

    assert "lr_schedule" not in hashed_settings(sft.Config())
    assert hashed_settings(sft.Config(lr_schedule="constant"))["lr_schedule"] == "constant"
    assert "sampling" not in hashed_settings(sft.Config())
    assert hashed_settings(sft.Config(sampling="random"))["sampling"] == "random"


def _sft_watching(runs, monkeypatch, settings: list[str], watch):
    """`r3rag sft` on the teacher data with `settings`; `watch(trainer)` is called once training ends."""
    from r3rag.training import trainers

    train = trainers.FastSFTTrainer.train

    def spy(self, *args, **kwargs):
        out = train(self, *args, **kwargs)
        watch(self)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(trainers.FastSFTTrainer, "train", spy)
        return run_stage("sft", None, [*TINY_SFT, *settings], runs)


@pytest.mark.parametrize("schedule, last_lr", [("cosine", 0.0), ("constant", 1e-2)])
def test_the_learning_rate_at_the_last_update(runs, monkeypatch, schedule, last_lr):
    seen = []
    settings = ["limit=16", "max_steps=6", f"lr_schedule={schedule}", f"name={schedule}"]
    art = _sft_watching(runs, monkeypatch, settings, lambda trainer: seen.append(trainer.lr_scheduler.get_last_lr()[0]))
    assert art.manifest["metrics"]["steps"] == 6
    assert seen == [pytest.approx(last_lr, abs=1e-9)]


def test_an_unknown_schedule_is_one_clear_error(runs):
    from r3rag.util.errors import UserError

    with pytest.raises(UserError, match="lr_schedule"):
        run_stage("sft", None, [*TINY_SFT, "lr_schedule=linear"], runs)


def _batch_spreads(runs, monkeypatch, sampling: str) -> list[int]:
    """Longest minus shortest unpadded sample in each batch of one epoch's order."""
    spreads = []

    def watch(trainer):
        for batch in trainer.get_train_dataloader():
            lengths = (batch["input_ids"] != 0).sum(1)  # the tiny tokenizer's pad id is 0
            spreads.append(int(lengths.max() - lengths.min()))

    _sft_watching(runs, monkeypatch, ["limit=64", "max_steps=2", f"sampling={sampling}", f"name={sampling}"], watch)
    return spreads


def test_random_sampling_mixes_lengths_that_by_length_keeps_apart(runs, monkeypatch):
    by_length = _batch_spreads(runs, monkeypatch, "by_length")
    mixed = _batch_spreads(runs, monkeypatch, "random")
    assert len(by_length) == len(mixed) == 16
    assert sum(mixed) > 2 * sum(by_length)
