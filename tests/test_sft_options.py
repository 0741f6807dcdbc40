"""Two SFT settings whose defaults leave every existing artifact id alone: `sft.lr_schedule` (after
warmup the learning rate decays to 0, cosine, or stays at `lr`, constant) and `sft.sampling` (batches
of similar lengths, by_length, or any mix, random)."""

import pytest

from r3rag.experiments.pipeline import run_stage
from r3rag.util.config import hashed_settings
from tests.conftest import build_teacher_data

TINY_SFT = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "bf16=false", "lr=1e-2", "batch_size=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = tmp_path_factory.mktemp("schedule-runs")
    build_teacher_data(runs)
    return runs


def test_the_default_schedule_leaves_the_hash_alone():
    from r3rag.stages import sft

    assert "lr_schedule" not in hashed_settings(sft.Config())
    assert hashed_settings(sft.Config(lr_schedule="constant"))["lr_schedule"] == "constant"
    assert "sampling" not in hashed_settings(sft.Config())
    assert hashed_settings(sft.Config(sampling="random"))["sampling"] == "random"


@pytest.mark.parametrize("schedule, last_lr", [("cosine", 0.0), ("constant", 1e-2)])
def test_the_learning_rate_at_the_last_update(runs, monkeypatch, schedule, last_lr):
    from r3rag.training import trainers

    seen = {}
    train = trainers.FastSFTTrainer.train

    def spy(self, *args, **kwargs):
        out = train(self, *args, **kwargs)
        seen["lr"] = self.lr_scheduler.get_last_lr()[0]
        return out

    monkeypatch.setattr(trainers.FastSFTTrainer, "train", spy)
    art = run_stage(
        "sft", None, [*TINY_SFT, "limit=16", "max_steps=6", f"lr_schedule={schedule}", f"name={schedule}"], runs
    )
    assert art.manifest["metrics"]["steps"] == 6
    assert seen["lr"] == pytest.approx(last_lr, abs=1e-9)


def test_an_unknown_schedule_is_one_clear_error(runs):
    from r3rag.util.errors import UserError

    with pytest.raises(UserError, match="lr_schedule"):
        run_stage("sft", None, [*TINY_SFT, "lr_schedule=linear"], runs)


def _batch_spreads(runs, monkeypatch, sampling: str) -> list[int]:
    """Longest minus shortest unpadded sample in each batch of the run's first epoch."""
    from r3rag.training import trainers

    seen = []
    train = trainers.FastSFTTrainer.train

    def spy(self, *args, **kwargs):
        for batch in self.get_train_dataloader():
            lengths = (batch["input_ids"] != 0).sum(1)  # the tiny tokenizer's pad id is 0
            seen.append(int(lengths.max() - lengths.min()))
        return train(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(trainers.FastSFTTrainer, "train", spy)
        run_stage("sft", None, [*TINY_SFT, "limit=64", "max_steps=2", f"sampling={sampling}", f"name={sampling}"], runs)
    return seen


def test_random_sampling_mixes_lengths_that_by_length_keeps_apart(runs, monkeypatch):
    by_length = _batch_spreads(runs, monkeypatch, "by_length")
    mixed = _batch_spreads(runs, monkeypatch, "random")
    assert len(by_length) == len(mixed) == 16
    assert sum(mixed) > 2 * sum(by_length)
