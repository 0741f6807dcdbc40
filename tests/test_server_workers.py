"""`r3rag serve-retriever --workers 2`: two processes on one port answer the same as in-process,
both take connections, both map the index files (one copy in the page cache, not one each), a
taken port fails before anything loads, and stopping the server stops its workers. Loopback only."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from r3rag.experiments.pipeline import run_stage
from r3rag.retrieval import load_retriever
from r3rag.retrieval.remote import RemoteRetriever
from r3rag.retrieval.serving import serve
from r3rag.util.errors import UserError

pytestmark = pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="needs SO_REUSEPORT")

QUERIES = ["Who is a pilot in Korla?", "string instrument", "born in 1990", "lava and ash", "Fleming antibiotic"]


@pytest.fixture(scope="module")
def index_ref(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workers")
    corpus = tmp / "corpus.jsonl"
    jobs, cities = ["baker", "pilot", "nurse", "farmer"], ["Velmar", "Korla", "Dunmore"]
    with open(corpus, "w") as f:
        for i in range(300):
            text = f"Person {i} is a {jobs[i % 4]} who lives in {cities[i % 3]} and was born in {1950 + i % 60}."
            f.write(json.dumps({"id": f"p{i}", "contents": f'"Person {i}"\n{text}'}) + "\n")
        f.write(json.dumps({"id": "v", "title": "Volcano", "text": "A rupture through which lava and ash escape."}))
    return run_stage("index", None, [f"corpus={corpus}", "world="], tmp / "runs")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health_fresh_connection(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # a new connection: the kernel picks a worker
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _start_two_workers(index_ref) -> tuple[subprocess.Popen, int]:
    """`serve-retriever --workers 2`, returned once the parent says every worker listens: the first
    worker answers /health while the second may still be loading (on a busy machine, for seconds)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "r3rag.cli", "serve-retriever", "--index", str(index_ref.path), "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = []
    for line in proc.stderr:  # ends at EOF if the server exits before it serves
        said.append(line)
        if "with 2 workers" in line:
            return proc, port
    raise AssertionError(f"the workers did not start: {''.join(said)}")


@pytest.fixture(scope="module")
def two_workers(index_ref):
    proc, port = _start_two_workers(index_ref)
    try:
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_two_workers_answer_like_in_process(index_ref, two_workers):
    proc, port = two_workers
    pids = {_health_fresh_connection(port)["pid"] for _ in range(60)}
    assert len(pids) == 2 and proc.pid not in pids  # both workers take connections; the parent serves none
    local = load_retriever(index_ref.path / "index")
    want = local.search(QUERIES, 5)
    for _ in range(6):  # fresh clients: their connections land on either worker
        remote = RemoteRetriever(f"http://127.0.0.1:{port}", retries=0)
        got = remote.search(QUERIES, 5)
        remote.close()
        assert [[(h.doc_id, h.score, h.title, h.text) for h in r] for r in got] == [
            [(h.doc_id, h.score, h.title, h.text) for h in r] for r in want
        ]
    assert _health_fresh_connection(port)["docs"] == 301


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps (Linux)")
def test_workers_map_the_one_index_not_a_copy(index_ref, two_workers):
    _, port = two_workers
    pids = {_health_fresh_connection(port)["pid"] for _ in range(60)}
    index = (index_ref.path / "index").resolve()
    shared = [index / "bm25/data.csc.index.npy", index / "bm25/indices.csc.index.npy", index / "docs/docs.bin"]
    for pid in pids:
        maps = Path(f"/proc/{pid}/maps").read_text()
        for f in shared:
            assert str(f) in maps, (pid, f)  # file-backed pages: the page cache's one copy


def test_taken_port_fails_before_loading(two_workers, tmp_path):
    _, port = two_workers
    with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
        serve(tmp_path / "no-index", port=port, workers=2)


def test_a_bad_index_is_one_line_from_the_workers(tmp_path):
    with pytest.raises(UserError, match="not an index"):
        serve(tmp_path, port=0, workers=2)


def test_stopping_the_server_stops_its_workers(index_ref):
    proc, port = _start_two_workers(index_ref)
    pids = {_health_fresh_connection(port)["pid"] for _ in range(40)}
    assert len(pids) == 2
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    for pid in pids:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} outlived the server"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
