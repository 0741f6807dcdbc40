"""What every stage shares: the run context (runs dir, console) and the artifact bookkeeping.

Usage (inside a stage's run):
    inputs = resolve_inputs(cfg, INPUTS, ctx)
    writer = ctx.writer("index", cfg, inputs, INPUTS)
    if writer.existing: return ctx.skipped(writer)
    with writer: ...
    return ctx.done(writer)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from r3rag.artifacts import ArtifactRef, ArtifactWriter, default_runs_dir, resolve


@dataclass
class Context:
    runs_dir: Path = field(default_factory=default_runs_dir)
    console: Console = field(default_factory=lambda: Console(stderr=True))

    def writer(self, stage: str, cfg, inputs: dict[str, ArtifactRef], input_fields: dict[str, str]) -> ArtifactWriter:
        config = dataclasses.asdict(cfg)
        # Input refs ("world:latest" or a path) are hashed by content, not by how they were named.
        hashed = {k: v for k, v in config.items() if k not in input_fields}
        w = ArtifactWriter(stage, cfg.name, hashed, inputs, self.runs_dir, seed=getattr(cfg, "seed", None))
        w.config = config
        return w

    def skipped(self, w: ArtifactWriter) -> ArtifactRef:
        self.console.print(f"[dim]{w.stage}: up to date, reusing {w.final}[/dim]")
        return w.existing

    def done(self, w: ArtifactWriter) -> ArtifactRef:
        self.console.print(f"[green]{w.stage}[/green]: wrote {w.final} ({w.ref.manifest['seconds']:.1f}s)")
        return w.ref

    def progress(self) -> Progress:
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True)


def resolve_inputs(cfg, input_fields: dict[str, str], ctx: Context) -> dict[str, ArtifactRef]:
    """Resolve every input field that is set (an empty string means "not used")."""
    return {f: resolve(getattr(cfg, f), stage, ctx.runs_dir) for f, stage in input_fields.items() if getattr(cfg, f)}


def set_threads(n: int) -> None:
    """CPU threads for torch; 0 = leave torch's default."""
    if n > 0:
        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))
