"""Library noise is off unless `r3rag --verbose`, and r3rag's own progress display stays.

- `quiet.configure` (in a fresh interpreter: it changes process-wide settings) switches off the
  Hugging Face bars, logging and FutureWarnings, whether the libraries are imported after it (the
  CLI) or before (a notebook); `configure(verbose=True)` leaves them on.
- `StepProgress` prints a line per tenth of a training run, with the latest loss, when stderr is
  not a terminal.
- Through the CLI: `r3rag sft` on a tiny world prints no library bars or warnings, but its own
  progress lines; `r3rag --verbose sft` prints the Trainer's bars. `r3rag eval` loads a policy
  without transformers' "Loading weights" bar, which `--verbose` shows.
"""

import io
import os
import subprocess
import sys

import pytest

from r3rag.util.quiet import LIBRARY_ENV, STREAM_ENV
from tests.conftest import build_teacher_data

# What the libraries print on their own: transformers' weight bars, datasets' map bars
# ("Truncating train dataset ... examples/s"), the Trainer's tqdm ("it/s"), TRL's FutureWarnings.
NOISE = ("Loading weights", "Writing model shards", "examples/s", "it/s", "FutureWarning")


def clean_env() -> dict[str, str]:
    """This process's environment without the variables `quiet.configure` sets: a CLI test run
    in-process before (tests/cli_helpers.r3rag_inprocess) leaves them here for every child."""
    return {k: v for k, v in os.environ.items() if k not in LIBRARY_ENV and k not in STREAM_ENV}


def run_python(code: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr
    return out


STATE = """
import json, warnings
import datasets, huggingface_hub.utils, transformers
from transformers.utils import logging
warnings.warn("a library's FutureWarning", FutureWarning)
logging.get_logger("transformers").warning("a library's log warning")
print(json.dumps([logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled(),
                  huggingface_hub.utils.are_progress_bars_disabled()]))
"""


@pytest.mark.parametrize("before", [False, True], ids=["imported-after", "imported-before"])
def test_configure_quiet_silences_the_libraries(before):
    first = "import transformers, datasets\n" if before else ""
    out = run_python(f"{first}from r3rag.util import quiet\nquiet.configure(verbose=False)\n{STATE}")
    assert out.stdout.strip().splitlines()[-1] == "[false, false, true]"
    assert "FutureWarning" not in out.stderr and "log warning" not in out.stderr


def test_configure_verbose_leaves_the_libraries_alone():
    out = run_python(f"from r3rag.util import quiet\nquiet.configure(verbose=True)\n{STATE}")
    assert out.stdout.strip().splitlines()[-1] == "[true, true, false]"
    assert "FutureWarning" in out.stderr and "log warning" in out.stderr


def test_step_progress_prints_a_line_per_tenth_off_a_terminal(monkeypatch):
    from rich.console import Console
    from transformers import TrainerControl, TrainerState

    import r3rag.util.progress
    from r3rag.training.observe import StepProgress

    clock = [0.0]
    monkeypatch.setattr(r3rag.util.progress, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    progress = StepProgress("sft", Console(file=stream, force_terminal=False, width=200))
    state, control = TrainerState(max_steps=20), TrainerControl()
    args = None  # StepProgress reads the state only
    progress.on_train_begin(args, state, control)
    for step in range(1, 21):
        clock[0] += 2.0  # 2 s a step
        state.global_step = step
        progress.on_step_end(args, state, control)
        if step % 5 == 0:  # logging_steps=5: the line of step 10 waits for step 10's loss
            progress.on_log(args, state, control, logs={"loss": 2.0 / step, "learning_rate": 1e-3})
    progress.on_log(args, state, control, logs={"train_loss": 0.123, "train_runtime": 1.0})
    progress.on_train_end(args, state, control)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10, lines
    assert lines[0] == "sft: step 2/20, 2 s/step, ETA 36 s"
    assert lines[2] == "sft: step 6/20, loss 0.4, 2 s/step, ETA 28 s"
    assert lines[4] == "sft: step 10/20, loss 0.2, 2 s/step, ETA 20 s"
    assert lines[-1] == "sft: step 20/20, loss 0.1, 2 s/step"  # done: no ETA


def test_step_progress_prints_a_line_a_step_once_30_s_have_passed(monkeypatch):
    """Slow steps (SmolLM2's SFT on 2 CPU cores: ~90 s): a line a tenth of the run would come
    hours apart; a step ending LINE_SECONDS after the last line gets one. A resumed run's rate
    is that of its own steps."""
    from rich.console import Console
    from transformers import TrainerControl, TrainerState

    import r3rag.util.progress
    from r3rag.training.observe import StepProgress

    clock = [0.0]
    monkeypatch.setattr(r3rag.util.progress, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    progress = StepProgress("rl", Console(file=stream, force_terminal=False, width=200))
    state, control = TrainerState(max_steps=100, global_step=40), TrainerControl()  # resumed at step 40
    progress.on_train_begin(None, state, control)
    for step in range(41, 101):
        clock[0] += 12.0
        state.global_step = step
        progress.on_step_end(None, state, control)
    progress.on_train_end(None, state, control)
    lines = stream.getvalue().splitlines()
    steps = [int(line.split()[2].split("/")[0]) for line in lines]
    assert steps[:4] == [43, 46, 49, 50] and steps[-1] == 100  # every 36 s, and at each tenth
    assert lines[0] == "rl: step 43/100, 12 s/step, ETA 11 min"  # 57 steps left at 12 s


def test_step_progress_draws_a_bar_on_a_terminal_and_prints_no_lines():
    from rich.console import Console
    from transformers import TrainerControl, TrainerState

    from r3rag.training.observe import StepProgress

    stream = io.StringIO()
    progress = StepProgress("rl", Console(file=stream, force_terminal=True, width=100))
    state, control = TrainerState(max_steps=4), TrainerControl()
    progress.on_train_begin(None, state, control)
    for step in range(1, 5):
        state.global_step = step
        progress.on_step_end(None, state, control)
        progress.on_log(None, state, control, logs={"reward": 0.5})
    progress.on_train_end(None, state, control)
    assert "rl: steps" in stream.getvalue() and "rl: step 4/4" not in stream.getvalue()


TINY_SFT = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "epochs=1", "batch_size=16", "bf16=false"]
TINY_EVAL = ["rl=", "systems=[sft]", "limit=4", "max_turns=2", "max_new_tokens=8"]


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    """A runs dir with a tiny world, its index, the oracle's trajectories and an SFT policy."""
    from r3rag.experiments.pipeline import run_stage

    runs = tmp_path_factory.mktemp("quiet") / "runs"
    build_teacher_data(runs)
    run_stage("sft", None, TINY_SFT, runs)
    return runs


def _command(runs, options: tuple, stage: str, settings: list[str], seed: int) -> list[str]:
    """`r3rag [options] <stage> --set ...`; a new seed each time, so the stage runs (an artifact
    that already exists is only reused, and says nothing)."""
    sets = [arg for s in [*settings, f"seed={seed}"] for arg in ("--set", s)]
    return [sys.executable, "-m", "r3rag.cli", *options, stage, "--runs-dir", str(runs), *sets]


def quiet_and_verbose(runs, stage: str, settings: list[str]) -> tuple[subprocess.CompletedProcess, ...]:
    """The stage run as `r3rag` and as `r3rag --verbose`, side by side: each process spends most of
    its time importing torch, transformers and TRL, one core's work, so two at once take the time
    of one on 2 cores."""
    runs_of = {opts: _command(runs, opts, stage, settings, seed) for seed, opts in enumerate([(), ("--verbose",)], 1)}
    procs = {
        opts: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        for opts, cmd in runs_of.items()
    }
    done = []
    for opts, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        done.append(subprocess.CompletedProcess(runs_of[opts], proc.returncode, out, err))
    return tuple(done)


@pytest.mark.slow  # two runs of a stage, each importing torch, transformers and TRL afresh
def test_training_prints_its_own_progress_and_no_library_noise(sft_runs):
    quiet, verbose = quiet_and_verbose(sft_runs, "sft", TINY_SFT)
    assert not [n for n in NOISE if n in quiet.stderr], quiet.stderr
    assert "sft: step " in quiet.stderr and "sft: wrote " in quiet.stderr, quiet.stderr
    assert "it/s" in verbose.stderr and "examples/s" in verbose.stderr, verbose.stderr  # Trainer's, datasets' bars
    assert "sft: step " not in verbose.stderr and "sft: wrote " in verbose.stderr


@pytest.mark.slow  # two runs of a stage, each importing torch, transformers and TRL afresh
def test_loading_a_policy_shows_no_weight_bar_unless_verbose(sft_runs):
    quiet, verbose = quiet_and_verbose(sft_runs, "eval", TINY_EVAL)
    assert not [n for n in NOISE if n in quiet.stderr], quiet.stderr
    assert "eval: wrote " in quiet.stderr
    assert "Loading weights" in verbose.stderr, verbose.stderr


@pytest.mark.parametrize("verbose", [False, True])
def test_vllm_logs_to_stderr_verbose_or_not_and_only_errors_when_quiet(verbose):
    """stdout is the artifact's path: vLLM (which logs to stdout by default, its shutdown warning
    included) is pointed at stderr before it is imported, and kept to errors unless --verbose."""
    code = f"from r3rag.util import quiet; quiet.configure(verbose={verbose}); import os; "
    code += "print(os.environ.get('VLLM_LOGGING_STREAM'), os.environ.get('VLLM_LOGGING_LEVEL'))"
    stream, level = run_python(code).stdout.split()
    assert stream == "ext://sys.stderr"
    assert level == ("None" if verbose else "ERROR")
