"""What every stage shares: the run context (runs dir, console) and the artifact bookkeeping.

Usage (inside a stage's run):
    INPUTS = {"world": "world", "index": "index", "questions": FILE}   # FILE: a plain file input
    inputs = resolve_inputs(cfg, INPUTS, ctx)
    questions = load_questions(inputs["questions"].path, limit=cfg.limit)   # id, question, golden_answers, metadata
    writer = ctx.writer("index", cfg, inputs, INPUTS)
    if writer.existing: return ctx.skipped(writer)
    with writer: ...
    return ctx.done(writer)
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from r3rag.core.artifacts import (
    FILE,
    ArtifactRef,
    ArtifactWriter,
    default_runs_dir,
    file_sha256,
    load_manifest,
    resolve,
)
from r3rag.core.build_lock import ArtifactBusy, BuildLock
from r3rag.util.config import hashed_settings, hashed_when_set, recorded_settings
from r3rag.util.errors import UserError
from r3rag.util.jsonl import iter_numbered, read_jsonl, unique_by_id

if TYPE_CHECKING:
    from rich.console import Console

    from r3rag.util.progress import Progress


def _stderr_console() -> Console:
    # rich imported here, not at the top: `r3rag <stage> --help` imports this module (~40 ms of its 0.3 s)
    from rich.console import Console

    return Console(stderr=True)


class NotBuilt(Exception):
    """`--status`: the artifact this stage would write does not exist yet (its id, final path and
    config say which, and where a killed run's work would be)."""

    def __init__(self, stage: str, artifact_id: str, final: Path, cfg):
        super().__init__(f"{stage}: {artifact_id} not built")
        self.stage, self.id, self.final, self.cfg = stage, artifact_id, final, cfg


@dataclass
class Context:
    runs_dir: Path = field(default_factory=default_runs_dir)
    console: Console = field(default_factory=_stderr_console)
    writers: list[ArtifactWriter] = field(default_factory=list)  # this command's, for `tidy_on_failure`
    status_only: bool = False  # `r3rag run --status`: find artifacts, build nothing (NotBuilt)
    # An artifact another process is building (r3rag.core.build_lock): wait for it and reuse it, or
    # (a `run --jobs` worker) raise ArtifactBusy and build something else meanwhile.
    busy: Literal["wait", "skip"] = "wait"
    locks: list[BuildLock] = field(default_factory=list)  # held until the stage returns

    @contextmanager
    def tidy_on_failure(self):
        """A command that fails (bad input, missing model, Ctrl-C) leaves no empty folders or work
        files in the runs dir; an interrupted run's checkpoints and journal lines stay for --resume.
        The stage's build locks are dropped either way."""
        try:
            yield self
        except BaseException:
            self._release_locks()  # first: a lock file would keep the stage's new folder from being removed
            for w in reversed(self.writers):
                w.discard()
            raise
        finally:
            self._release_locks()

    def _release_locks(self) -> None:
        for lock in self.locks:
            lock.release()

    def writer(self, stage: str, cfg, inputs: dict[str, ArtifactRef], input_fields: dict[str, str]) -> ArtifactWriter:
        # Input refs ("world:latest" or a path) are hashed by content, not by how they were named;
        # settings declared with `config.unhashed` (how to run: threads, resume, logging) not at all.
        hashed = {k: v for k, v in hashed_settings(cfg).items() if k not in input_fields}
        w = ArtifactWriter(stage, cfg.name, hashed, inputs, self.runs_dir, seed=getattr(cfg, "seed", None))
        w.config = recorded_settings(cfg)
        self.writers.append(w)
        if self.status_only and not w.existing:
            raise NotBuilt(w.stage, w.id, w.final, cfg)
        if not w.existing:
            self._lock(w)
        return w

    def _lock(self, w: ArtifactWriter) -> None:
        """Hold `w`'s build lock; where another process holds it, wait (then reuse what it
        published) or raise ArtifactBusy, as `busy` says."""
        if os.environ.get("RANK", "0") != "0":  # under accelerate launch the main process holds it for all
            return  # ranks (the others waiting on it would never join its training)
        lock = BuildLock(w.final)
        if not lock.acquire(wait=False):
            if self.busy == "skip":
                raise ArtifactBusy(w.final)
            from rich.text import Text

            self.console.print(Text(f"{w.stage}: {w.id} is being built by another r3rag process; waiting", style="dim"))
            lock.acquire(wait=True)
        self.locks.append(lock)
        m = load_manifest(w.final)  # published by another process since `w` looked, even without a wait
        w.existing = ArtifactRef(w.stage, w.id, w.final, m) if m else None

    # Text, not markup: the runs dir is the user's path, and rich would read `[x]` in it as a tag
    # and `:100:` as an emoji.
    def skipped(self, w: ArtifactWriter) -> ArtifactRef:
        from rich.text import Text

        self.console.print(Text(f"{w.stage}: up to date, reusing {w.final}", style="dim"))
        return w.existing

    def done(self, w: ArtifactWriter) -> ArtifactRef:
        from rich.text import Text

        self.console.print(Text.assemble((w.stage, "green"), f": wrote {w.final} ({w.ref.manifest['seconds']:.1f}s)"))
        return w.ref

    def progress(self) -> Progress:
        """A long loop's progress (r3rag.util.progress): a rich display with rate and ETA on a terminal,
        a plain line at most every LINE_SECONDS in a log file."""
        # Imported here: `r3rag <stage> --help` imports this module, and needs no progress display.
        from r3rag.util.progress import Progress

        return Progress(self.console)


def resolve_inputs(cfg, input_fields: dict[str, str], ctx: Context) -> dict[str, ArtifactRef]:
    """Resolve every input field that is set (an empty string means "not used")."""
    return {
        f: file_input(getattr(cfg, f)) if stage == FILE else resolve(getattr(cfg, f), stage, ctx.runs_dir)
        for f, stage in input_fields.items()
        if getattr(cfg, f)
    }


def model_ref(value: str, ctx: Context) -> ArtifactRef | None:
    """The `model` artifact (r3rag import-model) that `value` names: `model:latest`, `model:<id>` or
    its directory; None for anything else (a hub id, a plain model directory, `tiny`)."""
    if value.startswith("model:") and not Path(value).exists():
        return resolve(value, "model", ctx.runs_dir)
    if value and Path(value).is_dir() and (load_manifest(Path(value)) or {}).get("stage") == "model":
        return resolve(value, "model", ctx.runs_dir)
    return None


def add_model_input(
    value: str, inputs: dict[str, ArtifactRef], input_fields: dict[str, str], ctx: Context, key: str = "model"
) -> dict[str, str]:
    """Record a `model` artifact named by config field `key` as an input (its content hash, not its
    name, then enters the artifact id); returns the input fields for `ctx.writer`."""
    ref = model_ref(value, ctx)
    if ref is None:
        return input_fields
    inputs[key] = ref
    return {**input_fields, key: "model"}


def model_location(value: str, inputs: dict[str, ArtifactRef], key: str = "model") -> str:
    """What to load: a model artifact's `model/` directory (or the hub id / directory its
    model.json points at), else `value` itself (hub id or path)."""
    if key not in inputs:
        return value
    pointer = inputs[key].path / "model.json"
    if pointer.is_file():
        import json

        return json.loads(pointer.read_text())["model"]
    return str(inputs[key].path / "model")


def file_input(path: str | Path) -> ArtifactRef:
    """A plain input file as an input ref: the manifest records its path and sha256, and the
    stage's config hash follows its content (not its path)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    return ArtifactRef(FILE, path.name, path, {"content_hash": file_sha256(path)})


def load_questions(path: str | Path, limit: int = 0) -> list[dict]:
    """Questions in r3rag's schema (what `r3rag import` writes): `id`, `question`, `golden_answers`
    (non-empty list of strings), optional `metadata` (object). Ids become strings; errors name file:line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: questions file not found")
    out = unique_by_id(((f"{path}:{n}", _question(row, f"{path}:{n}")) for n, row in iter_numbered(path)), limit)
    if not out:
        raise UserError(f"{path}: no questions (the file is empty)")
    return out


@dataclass
class QuestionSource:
    """Where a stage's questions come from, the same keys in every stage that reads questions
    (synthesize, rl, eval extend it): the world artifact's `split`, or a question file."""

    world: str = "world:latest"  # the questions: world/<split>.jsonl, or...
    questions: str = ""  # ...a question JSONL file (what `r3rag import` writes)
    split: str = "train"  # which of the world's splits: train, dev or test
    limit: int = 0  # the first N questions (0 = all)
    # only the questions whose metadata type is one of these, before `limit` ([] = every type), e.g.
    # the long-horizon ones: [mentor_chain, founded_first, count_before]
    types: list[str] = hashed_when_set(default_factory=list, silent=True)

    def read_questions(self, inputs: dict[str, ArtifactRef]) -> list[dict]:
        """The questions, from the resolved `questions` file input, else the `world` artifact."""
        if "questions" in inputs:
            path = inputs["questions"].path  # read to `limit` only when no type filter comes first
            where, rows = str(path), load_questions(path, limit=0 if self.types else self.limit)
        else:
            where = f"{inputs['world'].path.name}/{self.split}.jsonl"
            path = inputs["world"].path / f"{self.split}.jsonl"
            rows = [{**q, "id": str(q["id"])} for q in read_jsonl(path, required=("id", "question", "golden_answers"))]
        rows = of_types(rows, self.types, where)
        return rows[: self.limit] if self.limit else rows


def of_types(rows: list[dict], types: list[str], where: str) -> list[dict]:
    """The rows whose metadata type is in `types` (all of them when it is empty); none is one line
    naming the types there are."""
    if not types:
        return rows
    kept = [q for q in rows if (q.get("metadata") or {}).get("type") in types]
    if not kept:
        there = sorted({str((q.get("metadata") or {}).get("type")) for q in rows})
        raise UserError(f"types={list(types)}: no such question in {where} (its types: {', '.join(there)})")
    return kept


def _question(row: dict, where: str) -> dict:
    for key in ("id", "question", "golden_answers"):
        if key not in row:
            raise UserError(f"{where}: missing required field {key!r} (convert the file with `r3rag import`)")
    qid, question, answers, meta = row["id"], row["question"], row["golden_answers"], row.get("metadata") or {}
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        raise UserError(f"{where}: field 'id' must be a non-empty string or integer")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: field 'question' must be a non-empty string")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise UserError(f"{where}: field 'golden_answers' must be a non-empty list of non-empty strings")
    if not isinstance(meta, dict):
        raise UserError(f"{where}: field 'metadata' must be an object")
    return {**row, "id": str(qid), "question": question, "golden_answers": answers, "metadata": meta}


def process_state():
    """accelerate's view of this process: the only one, or one of `accelerate launch`'s (on CPU only
    cpu=True joins the gloo group). Training stages do their work folder's file work on the main one."""
    import torch  # here, not at the top, as in set_threads
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def set_threads(n: int) -> None:
    """CPU threads for torch; 0 = leave torch's default. R3RAG_THREADS, where set (a `run --jobs`
    worker's share of the cores), caps both."""
    cap = int(os.environ.get("R3RAG_THREADS") or 0)
    n = min(n, cap) if n > 0 and cap > 0 else n or cap
    if n > 0:
        import torch  # here, not at the top: `r3rag <stage> --help` imports this module; torch takes seconds

        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))
