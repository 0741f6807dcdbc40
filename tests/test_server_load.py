"""A bounded load test of `r3rag serve-retriever` (loopback only): 16 clients x 500 requests while
slow-loris clients hold connections open (sending nothing, headers a byte at a time, a body a
byte at a time). Zero errors and zero 5xx, a bounded p99, and every slow connection closed by the
server within its header/body deadline. Prints the figures (README's reliability table)."""

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
from tests.conftest import TINY_WORLD

CLIENTS, REQUESTS, DEADLINE = 16, 500, 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(world_index_runs):
    from r3rag.core.artifacts import list_artifacts
    from r3rag.data.world import WorldConfig, generate_world

    index = list_artifacts(world_index_runs, "index")[0]
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "r3rag.cli",
            "serve-retriever",
            "--index",
            str(index.path),
            "--port",
            str(port),
            "--header-timeout",
            str(DEADLINE),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(f"{url}/health")
            break
        except httpx.TransportError:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
    w = generate_world(WorldConfig(seed=0, **TINY_WORLD))
    yield url, port, [q["question"] for q in w.train + w.test]
    proc.terminate()
    proc.wait(10)


def slow_client(port: int, kind: str, out: list) -> None:
    """Hold a connection the slow way; record how long until the server closed it and what it said."""
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n"
    payload = {"nothing": b"", "headers": head, "body": head + b'{"queries": ["a"], "topk": 3}' + b" " * 10}[kind]
    sent = 0 if kind != "body" else len(head)
    if kind == "body":
        s.sendall(head)
    reply = b""
    s.settimeout(0.1)
    while time.monotonic() - t0 < 4 * DEADLINE:
        try:
            chunk = s.recv(4096)
            if not chunk:
                break  # closed by the server
            reply += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            break
        if sent < len(payload):  # one byte every 0.1 s: never finishes within the deadline
            try:
                s.send(payload[sent : sent + 1])
                sent += 1
            except OSError:
                break
    out.append((kind, time.monotonic() - t0, reply.split(b"\r\n", 1)[0].decode(errors="replace")))
    s.close()


@pytest.mark.slow  # a load test, 16 clients and 500 requests: ~5 s (2 AVX2 cores)
def test_16_clients_500_requests_with_slow_loris(server):
    url, port, queries = server
    slow: list = []
    kinds = ["nothing"] * 24 + ["headers"] * 6 + ["body"] * 2
    loris = [threading.Thread(target=slow_client, args=(port, k, slow), daemon=True) for k in kinds]
    for t in loris:
        t.start()
    latencies: list[float] = []
    errors: list[str] = []

    def client(c: int) -> None:
        remote = RemoteRetriever(url, timeout=10, retries=0)  # no retries: any 5xx or drop is an error
        for r in range(REQUESTS):
            batch = [queries[(c * 131 + r * 7 + i) % len(queries)] for i in range(1 + r % 4)]
            t0 = time.perf_counter()
            try:
                rows = remote.search(batch, 3)
                assert len(rows) == len(batch) and all(len(row) == 3 for row in rows)
            except Exception as e:  # noqa: BLE001 - every failure counts; none may happen
                errors.append(f"client {c} request {r}: {e}")
            latencies.append(time.perf_counter() - t0)
        remote.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, range(CLIENTS)))
    wall = time.perf_counter() - t0
    for t in loris:
        t.join(5 * DEADLINE)
    lat = sorted(latencies)
    figures = {
        "requests": len(lat),
        "errors": len(errors),
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2),
        "max_ms": round(lat[-1] * 1000, 2),
        "slow_loris": len(slow),
        "slow_loris_closed_max_s": round(max(s[1] for s in slow), 2),
        "slow_body_replies": sorted({s[2] for s in slow if s[0] == "body"}),
    }
    print("\nload:", json.dumps(figures))
    assert not errors, errors[:3]
    assert len(lat) == CLIENTS * REQUESTS
    assert figures["p99_ms"] < 1000  # loopback, 2 shared CPU cores: typically a few tens of ms
    assert len(slow) == len(kinds)
    for kind, seconds, first_line in slow:  # every slow connection was cut near its deadline
        assert DEADLINE * 0.9 <= seconds < DEADLINE + 2.0, (kind, seconds)
        if kind == "body":
            assert "408" in first_line, first_line
    health = httpx.get(f"{url}/health").json()  # still healthy, every request counted
    assert health["status"] == "ok" and health["requests"] >= CLIENTS * REQUESTS


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port` (Linux /proc/net/tcp, hex little-endian)."""
    out = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if int(p, 16) == port and state == "0A":  # LISTEN
            out.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return out


@pytest.mark.slow  # starts the load tests' server (a module fixture): ~2 s (2 AVX2 cores)
def test_binds_loopback_by_default(server):
    _, port, _ = server  # started without --host
    assert listening_addresses(port) == {"127.0.0.1"}
