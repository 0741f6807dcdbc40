"""Faults in dependencies: the retrieval server going down and coming back in the middle of an
eval run (bounded retries carry it through, same numbers), or staying down (one error line
naming the server's URL, nothing published). The disk-full cases are in test_crash_safety.py;
teacher/judge endpoint errors and hangs are in test_openai_client.py and the stage tests."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from r3rag.core.artifacts import list_artifacts
from r3rag.experiments.pipeline import run_stage
from r3rag.retrieval import load_retriever
from r3rag.retrieval.server import make_app, running
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess

# a scripted system (search the question, answer the top title): no model, deterministic
EVAL = [
    "systems=[tt]",
    "models.tt.scripted=top-title",
    "sft=",
    "rl=",
    "limit=24",
    "batch_size=1",
]  # 6 chunks of 4: 6 searches


@pytest.fixture(scope="module")
def runs(world_index_runs):
    return world_index_runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tripwire:
    """A retriever that sets `tripped` after `after` searches (the server then goes down)."""

    def __init__(self, inner, after: int | None = None):
        self.inner, self.after, self.calls, self.tripped = inner, after, 0, threading.Event()
        self.docs, self.settings = inner.docs, inner.settings

    def search(self, queries, k):
        self.calls += 1
        if self.after is not None and self.calls == self.after:
            self.tripped.set()
            time.sleep(0.5)  # still in flight when the server starts shutting down: nothing more gets in
        return self.inner.search(queries, k)


def test_server_down_and_back_mid_eval(runs, tmp_path):
    index = list_artifacts(runs, "index")[0]
    retriever = load_retriever(index.path / "index")
    first, second = Tripwire(retriever, after=2), Tripwire(retriever)
    port, done, up = free_port(), threading.Event(), threading.Event()
    outage = {}

    def bounce():
        with running(make_app(first), port=port):
            up.set()
            first.tripped.wait(60)
        outage["down"] = time.monotonic()
        time.sleep(1.0)  # down for a second: connections refused, the client backs off and retries
        with running(make_app(second), port=port):
            outage["up"] = time.monotonic()
            done.wait(60)

    thread = threading.Thread(target=bounce, daemon=True)
    thread.start()
    assert up.wait(10)
    url = f"http://127.0.0.1:{port}"
    try:
        remote = run_stage("eval", None, [*EVAL, f"retriever={url}", "index=", "name=remote"], runs)
    finally:
        done.set()
        thread.join(10)
    local = run_stage("eval", None, [*EVAL, "name=local"], runs)
    assert first.calls == 2 and second.calls == 4  # 6 batches: 2 before the outage, 4 after it
    assert outage["up"] - outage["down"] >= 1.0
    metrics = [json.loads((r.path / "metrics.json").read_text())["systems"]["tt"] for r in (remote, local)]
    assert metrics[0]["em"] == metrics[1]["em"] and metrics[0]["n"] == 24
    preds = [(r.path / "predictions.jsonl").read_text() for r in (remote, local)]
    assert preds[0] == preds[1]


def test_server_that_stays_down_is_one_error_naming_it(runs):
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    out = r3rag_inprocess(
        "eval",
        "--runs-dir",
        runs,
        *[a for s in EVAL for a in ("--set", s)],
        "--set",
        f"retriever={url}",
        "--set",
        "index=",
        "--set",
        "name=down",
    )
    assert_one_line_error(out, f"retrieval server at {url} unreachable after 4 tries", "ConnectionRefused")
    assert time.monotonic() - t0 < 20  # bounded: 3 backoffs of 0.5, 1 and 2 s
    assert not list(runs.glob("eval/*down*")) and not list(runs.glob("eval/.tmp-*"))


def test_server_answering_5xx_then_recovering(runs):
    """A flaky server (500 on every other search) costs retries, not results."""
    index = list_artifacts(runs, "index")[0]
    retriever = load_retriever(index.path / "index")

    class Flaky(Tripwire):
        def search(self, queries, k):
            self.calls += 1
            if self.calls % 2:
                raise RuntimeError("index shard on fire")
            return self.inner.search(queries, k)

    flaky = Flaky(retriever)
    with running(make_app(flaky)) as url:
        ref = run_stage("eval", None, [*EVAL, f"retriever={url}", "index=", "name=flaky"], runs)
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
    assert flaky.calls == 12  # each of the 6 batches failed once, then succeeded
    assert json.loads((ref.path / "metrics.json").read_text())["systems"]["tt"]["n"] == 24
