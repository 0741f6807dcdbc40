"""Progress over a stage's long loop, on a terminal and in a log file alike.

On a terminal (or in Jupyter) a rich display redraws in place: what runs, a bar, n/N, the rate,
the ETA and the time so far. Off one (stderr into a log file, a CI job), where a bar cannot
redraw and rich prints nothing, plain lines instead:

    eval: sft 12/30 questions, 25 s/question, ETA 8 min
    eval: sft 30/30 questions, 24 s/question, 12 min in all

at most every LINE_SECONDS while the work goes on, and one when it ends if it took that long (a
loop of a few seconds prints none). The rate is this run's: work a resumed run takes over (an
eval's journaled chunks, synthesize's journaled questions) counts in n/N (`skip`), not in the
rate. Training's step lines (r3rag.training.observe.StepProgress) end with the same words (`rate_eta`):
`sft: step 3/8, loss 0.79, 41 s/step, ETA 3 min`.

Usage:
    with Progress(console) as progress:          # in a stage: `with ctx.progress() as progress:`
        task = progress.add_task("eval: sft", total=30, unit="questions")
        progress.skip(task, 8)                   # resumed: counted, not timed
        progress.advance(task, 4)                # or progress.update(task, completed=12)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

LINE_SECONDS = 30.0  # off a terminal: a progress line at most this often (tests lower it)


def monotonic() -> float:
    """The clock progress is timed by (a function of this module: tests replace it)."""
    return time.monotonic()


def live(console: Console) -> bool:
    """Whether a rich display can redraw on `console`: a terminal (not a dumb one), or Jupyter."""
    return console.is_jupyter or (console.is_terminal and not console.is_dumb_terminal)


@dataclass
class Count:
    """How far a loop has got, and how fast it went in this run."""

    unit: str  # what is counted, plural: "questions", "steps"
    total: int | None = None  # None: open-ended (no ETA)
    completed: int = 0
    untimed: int = 0  # of `completed`, those not done in this run (resumed work): not in the rate
    start: float = field(default_factory=lambda: monotonic())

    @property
    def finished(self) -> bool:
        return self.total is not None and self.completed >= self.total

    def elapsed(self) -> float:
        return monotonic() - self.start

    def rate(self) -> float | None:
        """Units a second, over this run so far (None before the first)."""
        done, seconds = self.completed - self.untimed, self.elapsed()
        return done / seconds if done > 0 and seconds > 0 else None

    def eta(self) -> float | None:
        rate = self.rate()
        if rate is None or self.total is None:
            return None
        return max(self.total - self.completed, 0) / rate


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def rate_text(rate: float, unit: str) -> str:
    """`2.5 questions/s`, or under one a second `41 s/step`."""
    if rate >= 1:
        return f"{_num(rate)} {unit}/s"
    return f"{_num(1 / rate)} s/{unit[:-1] if unit.endswith('s') else unit}"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def rate_eta(count: Count) -> str:
    """`41 s/step, ETA 3 min`: what is known of them (nothing before the first unit; no ETA once done)."""
    rate, eta = count.rate(), count.eta()
    parts = [rate_text(rate, count.unit)] if rate else []
    if eta is not None and not count.finished:
        parts.append(f"ETA {duration(eta)}")
    return ", ".join(parts)


def count_text(count: Count) -> str:
    """`12/30 questions` (`12 questions` open-ended)."""
    return f"{count.completed}{'' if count.total is None else f'/{count.total}'} {count.unit}"


def progress_line(description: str, count: Count, end: bool = False) -> str:
    """`eval: sft 12/30 questions, 25 s/question, ETA 8 min`; at the end `..., 12 min in all`."""
    if end:
        rate = count.rate()
        tail = [rate_text(rate, count.unit)] if rate else []
        tail.append(f"{duration(count.elapsed())} in all")
    else:
        tail = [rate_eta(count)]
    return ", ".join(p for p in (f"{description} {count_text(count)}", *tail) if p)


def say(console: Console, line: str) -> None:
    """A progress line as it is: the user's labels and paths are not markup, and it is not wrapped."""
    console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


class _CountColumn(ProgressColumn):
    """`12/30 questions, 25 s/question, ETA 8 min`: the plain lines' words, from the task's `count`."""

    def render(self, task) -> Text:
        count = task.fields.get("count")
        if count is None:
            return Text("")
        return Text(", ".join(p for p in (count_text(count), rate_eta(count)) if p), style="progress.remaining")


def rich_bar(console: Console, *extra: ProgressColumn) -> RichProgress:
    """The terminal display (tasks carry a `count` field): description, bar, n/N with rate and
    ETA, elapsed time, then `extra` columns. Transient: it goes once the loop is over."""
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), _CountColumn(), TimeElapsedColumn())
    return RichProgress(*columns, *extra, console=console, transient=True)


class Progress:
    """Tasks counted toward a total: a rich display where it can redraw (`live`), plain lines
    where it cannot. Safe to advance from another thread (synthesize's teacher requests)."""

    def __init__(self, console: Console):
        self.console = console
        self.bar = rich_bar(console) if live(console) else None
        self.counts: dict[int, Count] = {}
        self.descriptions: dict[int, str] = {}
        self._said: dict[int, float] = {}  # each task's last line (or its start)
        self._ended: set[int] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.bar:
            self.bar.stop()
        elif exc_type is None:  # a failed loop ends with its error, not a summary
            with self._lock:
                for task in self.counts:
                    self._end(task)

    def add_task(self, description: str, total: int | None = None, completed: int = 0, unit: str = "items") -> int:
        """A task; `completed` counts as done before this run (resumed), not in the rate."""
        count = Count(unit, total, completed, untimed=completed)
        with self._lock:
            if self.bar:
                task = int(self.bar.add_task(description, total=total, completed=completed, count=count))
            else:
                task = len(self.counts)
            self.counts[task], self.descriptions[task], self._said[task] = count, description, count.start
        return task

    def advance(self, task: int, n: int = 1) -> None:
        with self._lock:
            self._set(task, self.counts[task].completed + n)

    def skip(self, task: int, n: int) -> None:
        """`n` more done, by an earlier run (a journal's): counted, not timed."""
        with self._lock:
            self.counts[task].untimed += n
            self._set(task, self.counts[task].completed + n)

    def update(self, task: int, completed: int) -> None:
        with self._lock:
            self._set(task, completed)

    def _set(self, task: int, completed: int) -> None:
        count = self.counts[task]
        count.completed = completed
        if self.bar:
            self.bar.update(task, completed=completed)
        elif count.finished:
            self._end(task)
        elif monotonic() - self._said[task] >= LINE_SECONDS:
            say(self.console, progress_line(self.descriptions[task], count))
            self._said[task] = monotonic()

    def _end(self, task: int) -> None:
        """The closing line of a task that ran LINE_SECONDS or more (once)."""
        if task not in self._ended:
            self._ended.add(task)
            if self.counts[task].elapsed() >= LINE_SECONDS:
                say(self.console, progress_line(self.descriptions[task], self.counts[task], end=True))
