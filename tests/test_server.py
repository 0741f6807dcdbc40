"""The retrieval server and RemoteRetriever: same answers as in-process, 4xx on bad input,
concurrent requests batched, and stages searching through it. Loopback only."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from r3rag.retrieval.remote import RemoteRetriever
from r3rag.retrieval.server import make_app, running
from r3rag.retrieval.serving import serve
from r3rag.util.errors import UserError

LIMITS = dict(max_batch=64, max_topk=20, max_query_chars=300, max_body_bytes=50_000)


class Counting:
    """Wraps a retriever; counts `search` calls and can slow them down (so requests pile up)."""

    def __init__(self, inner, delay: float = 0.0, fail: bool = False):
        self.inner, self.delay, self.fail, self.calls = inner, delay, fail, 0
        self.docs, self.settings = inner.docs, inner.settings

    def search(self, queries, k):
        self.calls += 1
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("index on fire")
        return self.inner.search(queries, k)


@pytest.fixture(scope="module")
def world():
    from r3rag.data.world import WorldConfig, generate_world
    from r3rag.retrieval.bm25 import BM25Retriever

    w = generate_world(WorldConfig(seed=3, n_clusters=6, test_clusters=1, people_per_cluster=10))
    queries = [q["question"] for q in w.train + w.test]
    return BM25Retriever.build(w.docs), queries


@pytest.fixture(scope="module")
def server(world):
    retriever, _ = world
    counting = Counting(retriever)
    with running(make_app(counting, **LIMITS)) as url:
        yield url, counting


def _ids_scores(rows):
    return [[(h.doc_id, h.score) for h in row] for row in rows]


def _assert_same(got, want):
    """Equal scores rank by rank; equal ids except where a tie straddles the top-k cut."""
    assert [h.score for h in got] == [h.score for h in want]
    last = want[-1].score if want else None
    for score in {h.score for h in want}:
        g, w = ({h.doc_id for h in hits if h.score == score} for hits in (got, want))
        assert g == w or score == last


def test_server_matches_in_process(world, server):
    retriever, queries = world
    url, _ = server
    remote = RemoteRetriever(url)
    for lo, n, k in ((0, 1, 1), (1, 7, 3), (8, 40, 10), (48, 150, 5)):  # 150 > max_batch: split in chunks
        qs = queries[lo : lo + n]
        got = remote.search(qs, k)
        assert _ids_scores(got) == _ids_scores(retriever.search(qs, k))
        assert [(h.title, h.text) for h in got[0]] == [(h.title, h.text) for h in retriever.search(qs[:1], k)[0]]
    assert remote.search([], 3) == []
    assert remote.max_batch == LIMITS["max_batch"]  # learnt from /health


def test_search_r1_response_shape(world, server):
    retriever, queries = world
    url, _ = server
    hit = retriever.search(queries[:1], 1)[0][0]
    with_scores = httpx.post(f"{url}/retrieve", json={"queries": queries[:1], "topk": 1, "return_scores": True})
    assert with_scores.json() == {
        "result": [[{"document": {"id": hit.doc_id, "contents": f"{hit.title}\n{hit.text}"}, "score": hit.score}]]
    }
    plain = httpx.post(f"{url}/retrieve", json={"queries": queries[:1], "topk": 1}).json()
    assert plain == {"result": [[{"id": hit.doc_id, "contents": f"{hit.title}\n{hit.text}"}]]}
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["docs"] == len(retriever.docs) and health["backend"] == "bm25"


def _chunked(data: bytes):
    for i in range(0, len(data), 4096):
        yield data[i : i + 4096]


BAD = [
    ("malformed json", b'{"queries": ["a",', 400, "malformed JSON"),
    ("not an object", b'["a"]', 422, "JSON object"),
    ("no queries", b'{"topk": 3}', 422, "'queries' must be a list"),
    ("queries not a list", b'{"queries": "a b"}', 422, "'queries' must be a list"),
    ("empty queries", b'{"queries": []}', 422, "'queries' is empty"),
    ("non-string query", b'{"queries": ["a", 7]}', 422, "queries[1] must be a string"),
    ("batch too large", json.dumps({"queries": ["a"] * 65}).encode(), 422, "over max_batch=64"),
    ("topk zero", b'{"queries": ["a"], "topk": 0}', 422, "'topk' must be an integer from 1 to 20"),
    ("topk too large", b'{"queries": ["a"], "topk": 21}', 422, "from 1 to 20"),
    ("topk not int", b'{"queries": ["a"], "topk": "3"}', 422, "'topk'"),
    ("query too long", json.dumps({"queries": ["a" * 301]}).encode(), 422, "over max_query_chars=300"),
    ("bad return_scores", b'{"queries": ["a"], "return_scores": "yes"}', 422, "return_scores"),
    ("body too large", json.dumps({"queries": ["a" * 200] * 300}).encode(), 413, "over the limit"),
]


@pytest.mark.parametrize("body,status,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_are_4xx_with_a_message(server, body, status, message):
    url, _ = server
    resp = httpx.post(f"{url}/retrieve", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status and message in resp.json()["detail"], resp.text


def test_body_too_large_without_content_length(server):
    url, _ = server
    body = json.dumps({"queries": ["a" * 200] * 300}).encode()
    resp = httpx.post(f"{url}/retrieve", content=_chunked(body))  # chunked: the server must count
    assert resp.status_code == 413 and "over the limit" in resp.json()["detail"]
    assert httpx.get(f"{url}/health").status_code == 200  # and it is still serving


def test_concurrent_requests_are_batched(world):
    retriever, queries = world
    slow = Counting(retriever, delay=0.05)  # requests arriving during a search join the next batch
    n_clients, per_client = 8, 3
    barrier = threading.Barrier(n_clients)

    def client(c):
        remote = RemoteRetriever(url, max_batch=64)
        barrier.wait()
        out = []
        for r in range(per_client):
            qs, k = queries[(c * per_client + r) * 5 :][: 1 + (c + r) % 5], 1 + c % 4  # each its own batch and topk
            out.append((qs, k, remote.search(qs, k)))
        return out

    with running(make_app(slow, **LIMITS)) as url, ThreadPoolExecutor(n_clients) as pool:
        results = [r for rs in pool.map(client, range(n_clients)) for r in rs]
    assert slow.calls < n_clients * per_client / 2, slow.calls
    for qs, k, got in results:
        want = retriever.search(qs, k)
        assert len(got) == len(qs) and all(len(g) == k for g in got)
        for g, w in zip(got, want):
            _assert_same(g, w)


@pytest.mark.slow  # a load test, 8 clients and 200 requests: ~2 s (2 AVX2 cores)
def test_load_8_clients_200_requests(world, server):
    retriever, queries = world
    url, counting = server
    calls_before = counting.calls
    want = {lo: _ids_scores(retriever.search(queries[lo : lo + 8], 3)) for lo in range(0, 200)}
    errors = []

    def client(c):
        remote = RemoteRetriever(url, timeout=10, retries=0)
        for r in range(200):
            lo = (c * 31 + r) % 200
            try:
                if _ids_scores(remote.search(queries[lo : lo + 8], 3)) != want[lo]:
                    errors.append(f"client {c} request {r}: wrong results")
            except Exception as e:  # noqa: BLE001 - every failure is counted, none may happen
                errors.append(f"client {c} request {r}: {e}")

    t0 = time.time()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    assert not errors, errors[:3]
    assert time.time() - t0 < 60
    assert counting.calls - calls_before <= 1600


def test_remote_gives_up_on_a_dead_port():
    with socket.socket() as s:  # a port that was free a moment ago and that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteRetriever(f"http://127.0.0.1:{port}", timeout=0.5, retries=2, backoff=0.01)
    t0 = time.time()
    with pytest.raises(UserError, match=r"unreachable after 3 tries"):
        remote.search(["anything"], 3)
    assert time.time() - t0 < 5


def test_remote_retries_5xx_and_does_not_retry_4xx(world):
    retriever, _ = world
    failing = Counting(retriever, fail=True)
    with running(make_app(failing, **LIMITS)) as url:
        with pytest.raises(UserError, match=r"unreachable after 3 tries: HTTP 500"):
            RemoteRetriever(url, retries=2, backoff=0.01).search(["a"], 3)
        assert failing.calls == 3
        with pytest.raises(UserError, match=r"rejected /retrieve: HTTP 422 'topk'"):
            RemoteRetriever(url, retries=2, backoff=0.01).search(["a"], 50)
        assert failing.calls == 3


def test_open_retriever_rejects_a_non_url():
    from r3rag.retrieval import open_retriever

    with pytest.raises(UserError, match="not an http"):
        open_retriever("ftp://example.org", None)
    with pytest.raises(UserError, match="no retriever"):
        open_retriever("", None)


def test_eval_through_the_server_matches_in_process(pipeline_runs, tmp_path):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.retrieval import load_retriever

    runs, refs = pipeline_runs
    local = json.loads((refs["eval"].path / "metrics.json").read_text())["systems"]
    app = make_app(load_retriever(refs["index"].path / "index"))
    with running(app) as url:
        sets = [
            "limit=12",
            "max_turns=3",
            "max_new_tokens=16",
            f"retriever={url}",
            "index=",
            f"world={refs['world'].path}",
            f"sft={refs['sft'].path}",
            f"rl={refs['rl'].path}",
        ]
        ref = run_stage("eval", None, sets, tmp_path / "runs")  # a fresh runs dir: nothing to reuse
    remote = json.loads((ref.path / "metrics.json").read_text())["systems"]
    timing = ("seconds", "questions_per_s")  # wall-clock figures differ from run to run
    strip = lambda systems: {s: {k: v for k, v in m.items() if k not in timing} for s, m in systems.items()}  # noqa: E731
    assert strip(remote) == strip(local)
    assert ref.manifest["config"]["retriever"] == url and "index" not in ref.manifest["inputs"]


def test_serve_retriever_cli(pipeline_runs, tmp_path):
    runs, refs = pipeline_runs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "r3rag.cli", "serve-retriever", "--runs-dir", str(runs), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        health = None
        for _ in range(300):
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health").json()
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert health and health["status"] == "ok" and health["docs"] == refs["index"].manifest["metrics"]["docs"]
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):  # taken: fails before loading
            serve(tmp_path / "no-index", port=port)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
