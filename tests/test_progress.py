"""Long work shows progress on a terminal and in a log file alike (r3rag.util.progress).

- Off a terminal (stderr into a log file, CI), a loop prints plain lines with n/N, a rate and an
  ETA, at most every LINE_SECONDS, and a closing one when it took that long; work a resumed run
  takes over counts, but not in the rate. On a terminal: the rich display, no plain lines.
- Through the stages (LINE_SECONDS lowered to 0, stderr captured: not a terminal): eval (per
  system, question by question across chunks and turns), synthesize, sft, and the dense index's
  encoding print those lines; eval on a terminal draws rich's display instead.
"""

import io
import re

import pytest
from rich.console import Console

import r3rag.util.progress
import r3rag.util.quiet
from r3rag.experiments.pipeline import run_stage
from r3rag.util.progress import Progress

# `eval: tt 4/12 questions, 290 questions/s, ETA 0 s` (or `..., 3.4 s/question, ...`)
RATE = r"[\d.]+ (\w+/s|s/\w+)"


DURATION = r"[\d.]+ (s|min|h)"


def line_re(description: str, total: int | str, unit: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(description)} \d+/{total} {unit}, {RATE}, ETA {DURATION}$", re.M)


def end_re(description: str, total: int | str, unit: str) -> re.Pattern:
    r"""The closing line; `total` a number, or a regex group (`(\d+)`) the count repeats."""
    count = rf"{total}/{total}" if isinstance(total, int) else rf"{total}/\1"
    return re.compile(rf"^{re.escape(description)} {count} {unit}, {RATE}, {DURATION} in all$", re.M)


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(r3rag.util.progress, "monotonic", lambda: now[0])
    return now


@pytest.fixture
def log_lines(monkeypatch):
    """Every progress line, however short the loop; stderr read as a log file would be."""
    monkeypatch.setattr(r3rag.util.progress, "LINE_SECONDS", 0.0)
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # the CI's own settings would make stderr a terminal
        monkeypatch.delenv(var, raising=False)


def test_lines_off_a_terminal_at_most_every_interval_then_a_closing_one(clock):
    stream = io.StringIO()
    with Progress(Console(file=stream, width=60)) as progress:
        task = progress.add_task("eval: sft", total=30, unit="questions")
        progress.skip(task, 6)  # a killed run's journaled chunk: counted, not timed
        clock[0] = 10.0
        progress.advance(task, 2)  # 10 s after the start: no line yet
        clock[0] = 31.0
        progress.advance(task, 4)
        clock[0] = 40.0
        progress.advance(task, 1)  # 9 s after the last line
        clock[0] = 120.0
        progress.update(task, 30)
        short = progress.add_task("eval: rag", total=5, unit="questions")
        progress.advance(short, 5)  # done within LINE_SECONDS: says nothing
    assert stream.getvalue().splitlines() == [
        "eval: sft 12/30 questions, 5.2 s/question, ETA 2 min",  # 6 done here in 31 s, 18 left
        "eval: sft 30/30 questions, 5 s/question, 2 min in all",  # not wrapped at the console's width
    ]


def test_open_ended_and_fast_counts_read_per_second(clock, log_lines):
    stream = io.StringIO()
    with Progress(Console(file=stream)) as progress:
        task = progress.add_task("synthesize:", unit="teacher requests")
        clock[0] = 2.0
        progress.advance(task, 50)
    assert stream.getvalue().splitlines() == [
        "synthesize: 50 teacher requests, 25 teacher requests/s",  # no total: no ETA
        "synthesize: 50 teacher requests, 25 teacher requests/s, 2 s in all",
    ]


def test_a_failed_loop_ends_with_its_error_not_a_summary(clock, log_lines):
    stream = io.StringIO()
    with pytest.raises(RuntimeError), Progress(Console(file=stream)) as progress:
        progress.add_task("eval: sft", total=4, unit="questions")
        raise RuntimeError("killed")
    assert stream.getvalue() == ""


def test_a_terminal_gets_the_rich_display_with_rate_and_eta_not_lines(clock, log_lines):
    stream = io.StringIO()
    with Progress(Console(file=stream, force_terminal=True, width=120)) as progress:
        task = progress.add_task("eval: sft", total=30, unit="questions")
        clock[0] = 40.0
        progress.advance(task, 10)
        progress.bar.refresh()
    shown = stream.getvalue()
    assert "eval: sft" in shown and "10/30 questions, 4 s/question, ETA 80 s" in shown, shown
    assert not line_re("eval: sft", 30, "questions").search(shown)


EVAL = ["limit=12", "rl=", "sft=", "systems=[tt]", "models.tt.scripted=top-title", "batch_size=1"]


def test_eval_into_a_log_prints_lines_with_count_rate_and_eta(world_index_runs, log_lines, capsys):
    run_stage("eval", None, [*EVAL, "name=progress-log"], world_index_runs)
    err = capsys.readouterr().err
    # chunks of 4 questions (batch_size x 4); within one, questions count turn by turn
    assert len(line_re("eval: tt", 12, "questions").findall(err)) >= 2, err
    assert end_re("eval: tt", 12, "questions").search(err), err
    assert "eval: wrote " in err


def test_eval_on_a_terminal_draws_the_rich_display_and_no_lines(world_index_runs, log_lines, monkeypatch, capsys):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stderr is a terminal
    monkeypatch.setenv("TERM", "xterm")
    run_stage("eval", None, [*EVAL, "name=progress-terminal"], world_index_runs)
    err = capsys.readouterr().err
    assert "eval: tt" in err and "questions" in err, err  # the display, drawn then cleared
    assert not re.search(r"^eval: tt \d+/12", err, re.M), err


@pytest.fixture(scope="module")
def teacher_runs(world_index_runs):
    run_stage("synthesize", None, ["template=minimal", "doc_style=plain"], world_index_runs)
    return world_index_runs


def test_synthesize_into_a_log_prints_lines(teacher_runs, log_lines, capsys):
    run_stage("synthesize", None, ["template=minimal", "doc_style=plain", "name=progress"], teacher_runs)
    err = capsys.readouterr().err
    assert line_re("synthesize:", r"\d+", "questions").search(err), err
    assert end_re("synthesize:", r"(\d+)", "questions").search(err), err


def test_sft_into_a_log_extends_its_step_lines_with_rate_and_eta(teacher_runs, log_lines, monkeypatch, capsys):
    monkeypatch.setattr(
        r3rag.util.quiet, "_verbose", False
    )  # as the CLI has it: r3rag's step lines, not the Trainer's bar
    settings = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "max_steps=3", "batch_size=4", "bf16=false"]
    run_stage("sft", None, [*settings, "name=progress"], teacher_runs)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sft: step ")]
    assert len(lines) >= 2, lines
    assert re.fullmatch(rf"sft: step 1/\d+, (loss [\d.]+, )?{RATE}, ETA \d+ (s|min)", lines[0]), lines
    assert "ETA" not in lines[-1]  # the last step's: done


class _FakeEncoder:
    dim = 4

    def encode(self, texts, batch_size, normalize, progress=None):
        import numpy as np

        for start in range(0, len(texts), batch_size):
            if progress:
                progress(len(texts[start : start + batch_size]))
        return np.ones((len(texts), self.dim), dtype=np.float32)


def test_dense_encoding_counts_batches_and_takes_resumed_chunks_untimed(tmp_path, log_lines, monkeypatch, capsys):
    from r3rag.retrieval import dense

    monkeypatch.setattr(dense, "PROGRESS_MIN_DOCS", 1)
    docs = [{"id": str(i), "title": f"t{i}", "text": "x" * i} for i in range(30)]
    settings = {"encoder": "fake", "pooling": "mean", "passage_prefix": "", "normalize": True, "max_length": 8}
    dense._encode(docs, tmp_path, _FakeEncoder(), {**settings, "batch_size": 5}, chunk_size=10)
    err = capsys.readouterr().err
    assert len(line_re("index: encoding", 30, "passages").findall(err)) == 5, err  # a line a batch, the 6th ends
    assert end_re("index: encoding", 30, "passages").search(err), err
    shards = dense._encode(docs, tmp_path, _FakeEncoder(), {**settings, "batch_size": 5}, chunk_size=10)
    assert shards.encoded == 0  # every chunk on disk: counted, no rate
    assert capsys.readouterr().err.splitlines() == [
        "index: encoding 10/30 passages",
        "index: encoding 20/30 passages",
        "index: encoding 30/30 passages, 0 s in all",
    ]
