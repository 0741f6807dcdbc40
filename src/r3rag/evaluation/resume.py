"""A killed `r3rag eval` resumes where it stopped: every finished chunk of questions is journaled.

An eval of a real model over thousands of questions runs for hours; r3rag.stages.eval appends
each chunk's prediction rows (fsynced, r3rag.util.journal) to `runs/eval/.journal-<id>.jsonl`, keyed
by system, sample and the chunk's question range, with the seconds it took and, for a sampled
eval, torch's random state after it. A rerun with the same settings (the same artifact id)
takes the journaled chunks as they are and generates the rest from the random state the last
one left, so a resumed eval writes what a straight one would have. A chunk size changed in
between (`batch_size`) keys other ranges: those chunks are generated again, never counted twice.

Usage:
    with Journal(path) as journal:
        chunks = EvalChunks(journal)
        done = chunks.done(label, sample, lo, hi)          # None, or {"rows", "seconds", "rng"}
        chunks.record(label, sample, lo, hi, rows, seconds, sampled=True)
"""

from __future__ import annotations

import base64

from r3rag.util.journal import Journal


class EvalChunks:
    def __init__(self, journal: Journal):
        self.journal = journal
        self.by_key = {row["id"]: row for row in journal.rows}

    @staticmethod
    def key(label: str, sample: int, lo: int, hi: int) -> str:
        return f"{label}|{sample}|{lo}:{hi}"

    def done(self, label: str, sample: int, lo: int, hi: int) -> dict | None:
        """The journaled chunk, its random state put back (a sampled eval), or None."""
        row = self.by_key.get(self.key(label, sample, lo, hi))
        if row is not None and row.get("rng"):
            restore_rng(row["rng"])
        return row

    def record(self, label: str, sample: int, lo: int, hi: int, rows: list[dict], seconds: float, sampled: bool):
        row = {"id": self.key(label, sample, lo, hi), "rows": rows, "seconds": seconds}
        if sampled:
            row["rng"] = rng_state()
        self.journal.append(row)
        self.by_key[row["id"]] = row


def rng_state() -> dict:
    """torch's CPU and CUDA random states, base64 (sampling draws from them)."""
    import torch

    def b64(t) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode()

    cuda = [b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
    return {"cpu": b64(torch.get_rng_state()), "cuda": cuda}


def restore_rng(state: dict) -> None:
    import torch

    def tensor(text: str):
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["cpu"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])
