"""Watching an RL run: per-step metrics.jsonl, a sample of rollouts, step timings, reward curves.

- `MetricsLog` (a TrainerCallback, main process): one JSON line per logged step with
  everything TRL logs (reward, `rewards/<component>/mean`, KL, entropy, model-token
  lengths...) plus rollout statistics and `time/step` and `time/optimizer` (seconds in
  optimizer.step).
- `TrainClock` (a TrainerCallback): training seconds that survive a resume. Each checkpoint
  records the seconds trained up to it; a resumed run starts from its checkpoint's figure, so
  a run killed and resumed across sessions reports its whole training time, not its last leg.
  A checkpoint without the record (an older one) falls back to an estimate from the step times
  logged in metrics.jsonl up to it.
- `RolloutSampler`: the first N trajectories of each step, per process, as JSONL.
- `truncate_after(path, step)`: on resume, drop lines logged after the checkpoint.
- `plot_rewards(metrics.jsonl, png)`: reward and each component against the step.
- `show_progress(trainer, "sft")`: unless `--verbose`, `StepProgress` (one rich bar with the rate,
  ETA and latest loss / reward / dev EM; when stderr is not a terminal, a line per tenth of the
  run, and one a step once 30 s have passed since the last: `sft: step 3/8, loss 0.79, 41 s/step,
  ETA 3 min`) in place of the Trainer's tqdm bar and the log dicts it prints.

Usage:
    trainer = build_trainer(..., callbacks=[MetricsLog(work / "metrics.jsonl")],
                            sampler=RolloutSampler(work / "rollouts.rank0.jsonl", 4, rank=0))
    trainer = show_progress(trainer, "rl")
    plot_rewards(work / "metrics.jsonl", out / "reward_curves.png")
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from transformers import TrainerCallback

from r3rag.training.checkpoints import step_of
from r3rag.util import progress, quiet
from r3rag.util.jsonl import read_jsonl


class MetricsLog(TrainerCallback):
    def __init__(self, path: Path):
        self.path = Path(path)
        self._step_start = self._opt_start = 0.0
        self._step = self._opt = 0.0

    def on_step_begin(self, args, state, control, **kw):
        self._step_start, self._opt = time.perf_counter(), 0.0

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self._opt_start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kw):
        self._opt += time.perf_counter() - self._opt_start

    def on_step_end(self, args, state, control, **kw):
        self._step = time.perf_counter() - self._step_start

    def on_log(self, args, state, control, logs=None, **kw):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        row = {
            "step": state.global_step,
            **logs,
            "time/step": round(self._step, 4),
            "time/optimizer": round(self._opt, 4),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


class TrainClock(TrainerCallback):
    FILE = "r3rag_train_seconds.json"

    def __init__(self, resume_from: str | None, metrics: Path):
        self.before = seconds_before(resume_from, metrics) if resume_from else 0.0
        self.t0 = time.time()

    def seconds(self) -> float:
        return self.before + time.time() - self.t0

    def on_save(self, args, state, control, **kw):
        if state.is_world_process_zero:  # after the Trainer wrote the checkpoint
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (ckpt / self.FILE).write_text(json.dumps({"train_seconds": round(self.seconds(), 1)}))


def seconds_before(checkpoint: str, metrics: Path) -> float:
    """Seconds trained up to `checkpoint`: its record, else an estimate from the step times
    logged up to its step (`logged_seconds`)."""
    record = Path(checkpoint) / TrainClock.FILE
    if record.is_file():
        return float(json.loads(record.read_text())["train_seconds"])
    return logged_seconds(metrics, step_of(checkpoint))


def logged_seconds(metrics: Path, up_to_step: int) -> float:
    """An estimate of the seconds steps 1..`up_to_step` took: the median logged `time/step` of
    those steps times their number (the median, since a line logs one step's time and a run that
    was paused or shared the cores logs a few very long ones)."""
    rows = read_jsonl(metrics, allow_empty=True) if Path(metrics).is_file() else []
    times = [row["time/step"] for row in rows if "time/step" in row and row["step"] <= up_to_step]
    return statistics.median(times) * up_to_step if times else 0.0


def show_progress(trainer, label: str, console=None):
    """`trainer` with r3rag's StepProgress in place of its tqdm bar and printed logs, unless
    `--verbose` (then the Trainer's own display stays). Returns the trainer."""
    if quiet.is_verbose():
        return trainer
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)  # the one a Trainer with disable_tqdm=False has
    trainer.remove_callback(PrinterCallback)  # the one it has otherwise: prints each log dict on stdout
    trainer.add_callback(StepProgress(label, console))
    return trainer


# The log keys StepProgress shows, and their short names: SFT's loss, GRPO's reward and dev EM.
SHOWN = {"loss": "loss", "train_loss": "loss", "reward": "reward", "dev/em": "dev EM"}


class StepProgress(TrainerCallback):
    """One rich bar over a training run's steps with the rate, the ETA and the latest loss / reward /
    dev EM. When stderr is not a terminal (a log file on a cluster) a bar cannot redraw in place, so
    a line is printed at every `1/lines` of the run, and after any step that ends LINE_SECONDS or
    more after the last line (r3rag.util.progress), instead: `sft: step 3/8, loss 0.79, 41 s/step, ETA
    3 min`. The rate is that of the steps run in this process (a resumed run's). Main process only."""

    def __init__(self, label: str, console=None, lines: int = 10):
        from rich.console import Console

        self.label, self.lines = label, lines
        self.console = console or Console(stderr=True)
        self.latest = ""
        self._active = False
        self._bar = None  # on a terminal
        self._pending = 0  # off one: a step due a line, printed once that step's logs (if any) are in
        self._rate_eta = ""  # that step's rate and ETA

    def on_train_begin(self, args, state, control, **kw):
        self._active = state.is_world_process_zero
        self._every = max(1, math.ceil(state.max_steps / self.lines))
        self._count = progress.Count("steps", state.max_steps, state.global_step, untimed=state.global_step)
        self._said = self._count.start
        if self._active and progress.live(self.console):
            from rich.progress import TextColumn

            self._bar = progress.rich_bar(self.console, TextColumn("{task.fields[latest]}", markup=False))
            self._bar.start()
            self._task = self._bar.add_task(
                f"{self.label}: steps", total=state.max_steps, completed=state.global_step, count=self._count, latest=""
            )

    # The Trainer calls on_step_end, then on_log for that step: a step's line waits for its logs.
    def on_step_end(self, args, state, control, **kw):
        if not self._active:
            return
        self._flush(state)  # the previous step logged nothing
        self._count.completed = state.global_step
        if self._bar:
            self._bar.update(self._task, completed=state.global_step)
        elif (
            state.global_step % self._every == 0
            or state.global_step == state.max_steps
            or progress.monotonic() - self._said >= progress.LINE_SECONDS
        ):
            self._pending = state.global_step
            self._rate_eta = progress.rate_eta(self._count)  # as the step ended, not when its line is printed
            self._said = progress.monotonic()

    def on_log(self, args, state, control, logs=None, **kw):
        if not self._active:
            return
        shown = [f"{name} {logs[key]:.4g}" for key, name in SHOWN.items() if isinstance((logs or {}).get(key), float)]
        if shown:
            self.latest = ", ".join(shown)
        if self._bar:
            self._bar.update(self._task, latest=self.latest)
        self._flush(state)

    def on_train_end(self, args, state, control, **kw):
        self._flush(state)
        if self._bar:
            self._bar.stop()
            self._bar = None
        self._active = False

    def _flush(self, state) -> None:
        if self._pending:
            parts = (f"{self.label}: step {self._pending}/{state.max_steps}", self.latest, self._rate_eta)
            progress.say(self.console, ", ".join(p for p in parts if p))
            self._pending = 0


class RolloutSampler:
    def __init__(self, path: Path, per_step: int, rank: int = 0):
        self.path, self.per_step, self.rank = Path(path), per_step, rank

    def add(self, step: int, trajs, examples: list[dict], scores: list[dict]) -> None:
        if self.per_step <= 0:
            return
        with self.path.open("a") as f:
            for t, ex, s in list(zip(trajs, examples, scores))[: self.per_step]:
                row = {
                    "step": step,
                    "rank": self.rank,
                    "golden_answers": ex["golden_answers"],
                    "scores": s,
                    **t.to_json(),
                }
                f.write(json.dumps(row) + "\n")


def truncate_after(path: Path, step: int) -> None:
    """Keep the lines of steps <= `step` (those a resumed run will not log again), and drop a
    line a kill cut short."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if _step(line) <= step]
        path.write_text("".join(line + "\n" for line in kept))


def _step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return float("inf")


def merge_rollouts(paths: list[Path], out: Path) -> int:
    rows = [r for p in paths for r in read_jsonl(p, allow_empty=True)]
    rows.sort(key=lambda r: (r["step"], r["rank"]))
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def plot_rewards(metrics_path: Path, png: Path) -> None:
    from r3rag.util.extras import pyplot_or_skip

    plt = pyplot_or_skip(png.name)  # a by-product of training: without [plots], a note, not a failed run
    if plt is None:
        return

    rows = read_jsonl(metrics_path, allow_empty=True) if metrics_path.exists() else []
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["reward"] for r in rows], label="reward (weighted sum)", linewidth=2.2, color="black")
    names = sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    for k in names:
        ax.plot(steps, [r.get(k) for r in rows], label=k.split("/")[1], linewidth=1.2, alpha=0.85)
    ax.set_xlabel("step")
    ax.set_ylabel("mean over the step's rollouts")
    ax.set_title("GRPO reward curves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
