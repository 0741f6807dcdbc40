"""An append-only JSONL journal of finished items, so a long stage can resume after a crash.

Each finished item is one line, written to the OS before `append` returns, so a crash of the
process (SIGKILL, Ctrl-C, an exception) loses at most the items in flight. The file is fsynced
at most every `SYNC_SECONDS` and on close, so a power cut loses at most that long's items: an
fsync per item cost the demo's oracle synthesis ~45 s of its ~70 s for 34k cheap items, and an
item worth keeping at any price (a paid teacher request) still reaches the disk within a second.
Reopening reads what is there (a torn last line from a crash mid-write is cut off), `done`
holds the finished ids, and appending an id twice is refused. An exclusive lock stops two runs
from writing one journal.

Usage:
    with Journal(runs_dir / "synthesize" / f".journal-{artifact_id}.jsonl") as journal:
        for q in (q for q in questions if q["id"] not in journal.done):
            journal.append({"id": q["id"], ...})
        rows = journal.rows
    journal.remove()        # once the artifact is committed
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from r3rag.util.errors import UserError
from r3rag.util.jsonl import parse_line

SYNC_SECONDS = 1.0


class Journal:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows: list[dict] = []
        self.done: set[str] = set()
        self._f = None
        self._synced_at = time.monotonic()

    def __enter__(self) -> Journal:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a+b")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.close()
            raise UserError(
                f"{self.path}: another run is writing this journal (same stage, config and inputs)"
            ) from None
        self._load()
        return self

    def __exit__(self, *exc) -> bool:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()  # also releases the lock
        return False

    def append(self, row: dict) -> None:
        rid = str(row["id"])
        if rid in self.done:
            raise ValueError(f"journal {self.path}: id {rid!r} is already finished")
        self._f.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
        self._f.flush()  # in the OS from here: a killed process loses nothing
        if time.monotonic() - self._synced_at >= SYNC_SECONDS:  # on the disk: a power cut loses < 1 s
            os.fsync(self._f.fileno())
            self._synced_at = time.monotonic()
        self.rows.append(row)
        self.done.add(rid)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _load(self) -> None:
        self._f.seek(0)
        data = self._f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line torn by a crash mid-write: that item was not finished
            self._f.truncate(end)
        for lineno, raw in enumerate(data[:end].splitlines(), start=1):
            row = parse_line(raw.decode("utf-8", "replace"), f"{self.path}:{lineno}")
            if row is None:
                continue
            if str(row.get("id")) in self.done:
                raise UserError(
                    f"{self.path}:{lineno}: id {row.get('id')!r} appears twice (corrupt journal; "
                    "delete it to start over)"
                )
            self.rows.append(row)
            self.done.add(str(row["id"]))
        self._f.seek(0, os.SEEK_END)
