"""`r3rag sft --resume` (and `base`): a killed run continues from its last checkpoint and ends where a
straight run ends (weights, optimizer, scheduler, RNG and the data order restored)."""

import pytest
import torch

from r3rag.experiments.pipeline import run_stage
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess

# 48 trajectories, 8 a batch, 2 epochs: 12 updates, 6 an epoch; a checkpoint every 3
TINY = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "bf16=false", "lr=1e-2"]
RUN = [*TINY, "limit=48", "batch_size=8", "epochs=2", "save_steps=3"]


class _Killed(Exception):
    pass


@pytest.fixture(scope="module")
def runs(teacher_runs):
    return teacher_runs


def _kill_after_checkpoint(monkeypatch, step: int) -> None:
    """Stop the run right after the Trainer wrote checkpoint-`step`, as a kill there would."""
    from r3rag.training import observe

    class KillingClock(observe.TrainClock):
        def on_save(self, args, state, control, **kw):
            super().on_save(args, state, control, **kw)
            if state.global_step == step:
                raise _Killed

    monkeypatch.setattr(observe, "TrainClock", KillingClock)


def _weights(ref):
    from safetensors.torch import load_file

    return load_file(ref.path / "model" / "model.safetensors")


@pytest.mark.parametrize("killed_at", [9, 6, 3])
def test_a_resumed_sft_run_ends_where_a_straight_run_ends(runs, monkeypatch, killed_at):
    """Killed after checkpoint 9 (inside the second epoch, whose order the sampler must deal again
    as the straight run did), 6 (the first epoch's end) or 3 (inside the first), then resumed:
    the same weights as 12 updates in one go."""
    straight = run_stage("sft", None, [*RUN, "name=straight"], runs)
    name = f"name=resumed{killed_at}"
    with monkeypatch.context() as m:
        _kill_after_checkpoint(m, killed_at)
        with pytest.raises(_Killed):
            run_stage("sft", None, [*RUN, name], runs)
    (work,) = (runs / "sft").glob(f".work-resumed{killed_at}-*")
    kept = sorted(int(p.name.split("-")[1]) for p in (work / "checkpoints").glob("checkpoint-*"))
    assert kept == [s for s in (killed_at - 3, killed_at) if s > 0]  # save_total_limit=2
    resume = [] if killed_at == 9 else ["resume=true"]  # a plain rerun resumes too: resume=auto is the default
    resumed = run_stage("sft", None, [*RUN, name, *resume], runs)
    m = resumed.manifest["metrics"]
    assert m["resumed_from_step"] == killed_at and m["steps"] == straight.manifest["metrics"]["steps"] == 12
    assert 0 < m["train_seconds_before_resume"] < m["train_seconds"]  # the killed leg counts
    assert resumed.manifest["seconds"] >= m["train_seconds"] - 0.05  # and the stage's time covers it
    assert not work.exists()  # the checkpoints go once the policy is published
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


def test_checkpoints_do_not_change_what_is_trained(runs):
    """Saving every 3 updates (RNG state included) draws nothing: the same weights as no checkpoints."""
    saved = run_stage("sft", None, [*RUN, "name=plain"], runs)
    unsaved = run_stage("sft", None, [*RUN, "name=plain-unsaved", "save_steps=0"], runs)
    a, b = _weights(saved), _weights(unsaved)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


def test_sft_resume_without_a_checkpoint_is_a_clear_error(runs):
    out = r3rag_inprocess("sft", "--runs-dir", str(runs), *(a for s in TINY for a in ("--set", s)), "--resume")
    assert_one_line_error(out, "sft --resume: no checkpoint")


def test_resume_auto_starts_afresh_where_no_checkpoint_is(runs):
    ref = run_stage("sft", None, [*RUN, "name=auto", "resume=auto", "epochs=0.5"], runs)
    assert ref.manifest["metrics"]["resumed_from_step"] == 0 and ref.manifest["metrics"]["steps"] == 3


def test_the_sampler_deals_the_orders_transformers_sampler_deals():
    """Unbroken runs train as before: each epoch's order, and the global RNG after it, as stock."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from r3rag.training.trainers import ReplayableLengthSampler

    lengths = [(i * 37) % 101 + 1 for i in range(100)]
    torch.manual_seed(3)
    stock = LengthGroupedSampler(8, lengths=lengths)
    expected = [list(stock) for _ in range(3)] + [torch.rand(2).tolist()]
    torch.manual_seed(3)
    ours = ReplayableLengthSampler(lengths, 8)
    dealt = []
    for epoch in range(3):
        ours.set_epoch(epoch)
        dealt.append(list(ours))
    assert dealt + [torch.rand(2).tolist()] == expected
    assert len(set(map(tuple, dealt))) == 3  # three different orders


BASE = ["worlds=2", "world_clusters=3", "layers=1", "hidden=32", "heads=2", "intermediate=64"]
BASE += ["max_length=64", "batch_size=4", "epochs=2", "bf16=false", "lr=1e-2"]


@pytest.mark.slow  # ~50 s: three base trainings; the mechanism is sft's, tested above in the default suite
def test_a_resumed_base_run_ends_where_a_straight_run_ends(runs, monkeypatch):
    """`r3rag base` resumes as `r3rag sft` does: killed after a checkpoint inside its second epoch
    (whose shuffled order a resumed run must deal again), then rerun: the straight run's weights."""
    straight = run_stage("base", None, [*BASE, "name=straight", "save_steps=0"], runs)
    steps = straight.manifest["metrics"]["steps"]
    every = max(1, steps // 4)
    killed_at = next(s for s in range(every, steps, every) if s > steps // 2)  # in the second epoch
    with monkeypatch.context() as m:
        _kill_after_checkpoint(m, killed_at)
        with pytest.raises(_Killed):
            run_stage("base", None, [*BASE, "name=resumed", f"save_steps={every}"], runs)
    resumed = run_stage("base", None, [*BASE, "name=resumed", f"save_steps={every}"], runs)  # resume=auto
    m = resumed.manifest["metrics"]
    assert m["resumed_from_step"] == killed_at and m["steps"] == steps and 0 < m["train_seconds_before_resume"]
    assert not list((runs / "base").glob(".work-*"))  # the checkpoints go once the model is published
    a, b = _weights(straight), _weights(resumed)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_trains_the_same_weights(runs, monkeypatch, lora):
    """sft.gradient_checkpointing recomputes activations in the backward pass: switched on in the
    model the Trainer trains, and the same weights as without it (LoRA's adapters included, whose
    frozen inputs need grads switched on for the recompute to reach them)."""
    from transformers import PreTrainedModel

    enabled = []  # earlier 5.x releases of transformers name the method gradient_checkpointing_enable
    name = next(
        n for n in ("activation_checkpointing_enable", "gradient_checkpointing_enable") if hasattr(PreTrainedModel, n)
    )
    real = getattr(PreTrainedModel, name)
    monkeypatch.setattr(
        PreTrainedModel, name, lambda self, *a, **kw: enabled.append(type(self).__name__) or real(self, *a, **kw)
    )
    extra = [f"lora={str(lora).lower()}", "save_steps=0", "epochs=0.5"]
    plain = run_stage("sft", None, [*RUN, *extra, f"name=plain-gc{lora}"], runs)
    assert not enabled
    recomputed = run_stage("sft", None, [*RUN, *extra, f"name=gc{lora}", "gradient_checkpointing=true"], runs)
    assert enabled, "the Trainer never switched activation checkpointing on"
    a, b = _weights(plain), _weights(recomputed)
    init = _weights(run_stage("sft", None, [*RUN, *extra, f"name=init-gc{lora}", "max_steps=1", "lr=0"], runs))
    assert any(not torch.equal(a[k], init[k]) for k in a)  # it trained
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
