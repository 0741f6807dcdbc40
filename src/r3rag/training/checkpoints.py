"""A training stage's working directory and the Trainer checkpoints a killed run resumes from.

`sft` and `rl` keep `runs/<stage>/.work-<id>/checkpoints/checkpoint-<step>/` beside the
artifact while they train. `prepare_work` starts that directory afresh, or (resume=true /
"auto") keeps it and drops what came after the newest complete checkpoint;
`last_complete_checkpoint` is what a resume (and `r3rag run --status`) uses. Nothing here
imports transformers: `--status` reads checkpoints without loading a trainer.

Usage:
    resume_from = prepare_work(work, cfg.resume, "sft", state)   # None: start from step 0
    trainer.train(resume_from_checkpoint=resume_from)
    step_of(last_complete_checkpoint(work / "checkpoints"))        # 0 when there is none
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from r3rag.util.errors import UserError


def prepare_work(
    work: Path, resume: bool | str, stage: str, state, on_resume: Callable[[int], None] | None = None
) -> str | None:
    """The checkpoint to resume from (None: start afresh, the directory emptied). resume=true needs
    a checkpoint; "auto" resumes where there is one. On resume, checkpoints after the newest
    complete one are removed and `on_resume(step)` trims what the run logged after it. The main
    process does the file work; every process gets the same answer."""
    ckpts = work / "checkpoints"
    last = last_complete_checkpoint(ckpts)
    if resume == "auto":
        resume = last is not None
    if resume and last is None:
        raise UserError(
            f"{stage} --resume: no checkpoint in {ckpts} (nothing to resume; run without --resume, "
            "with the same settings as the killed run)"
        )
    if state.is_main_process:
        if not resume:
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        if resume:  # steps after the checkpoint are run (and logged) again
            for p in ckpts.glob("checkpoint-*"):
                if step_of(str(p)) > step_of(last):  # incomplete, or never to be reached again
                    shutil.rmtree(p)
            if on_resume:
                on_resume(step_of(last))
    state.wait_for_everyone()
    return last if resume else None


def last_complete_checkpoint(ckpts: Path) -> str | None:
    """The newest checkpoint-N with a whole trainer_state.json (the Trainer writes it last: a kill
    during a save leaves a directory without it, or with the file empty or cut short, and is skipped)."""
    done = [p for p in Path(ckpts).glob("checkpoint-*") if _whole_json(p / "trainer_state.json")]
    return str(max(done, key=lambda p: step_of(str(p)))) if done else None


def planned_steps(checkpoint: str) -> int:
    """The optimizer updates the run that wrote `checkpoint` was to make (its trainer_state's max_steps)."""
    return int(json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("max_steps") or 0)


def _whole_json(path: Path) -> bool:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):  # missing, or written in part (ValueError covers JSONDecodeError and bad UTF-8)
        return False
    return True


def step_of(checkpoint: str | None) -> int:
    """checkpoint-N's N (0 for None)."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1]) if checkpoint else 0


def check_save_steps(stage: str, save_steps: int) -> None:
    """`<stage>.save_steps`: 0 (no checkpoints) or a number of optimizer updates."""
    if save_steps < 0:
        raise UserError(f"{stage}.save_steps: expected 0 (no checkpoints) or a number of updates, got {save_steps}")
