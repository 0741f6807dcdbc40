"""Driving a retrieval server from a benchmark: a free port, waiting until it answers, and many
clients sending batches at once (benchmarks/retrieval.py, benchmarks/retrieval_scale.py).

Usage (beside the calling script, so on its sys.path when it runs as a script):
    from server_load import free_port, run_clients, wait_until_up
    wait_until_up(url, proc, timeout=30)
    wall, latencies = run_clients(url, batches, clients=8, k=3)
"""

from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc, timeout: float) -> None:
    """Until the server at `url` answers a search; SystemExit if `proc` exits or `timeout` s pass."""
    from r3rag.retrieval.remote import RemoteRetriever

    probe = RemoteRetriever(url, timeout=5, retries=0)
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe.search(["warm up"], 3)
            return
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None:
                raise SystemExit("the retrieval server exited at start") from None
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"the retrieval server did not start in {timeout:.0f} s") from None
            time.sleep(0.05)


def run_clients(
    url: str, batches: list[list[str]], clients: int, k: int, timeout: float = 30, max_batch: int = 64
) -> tuple[float, list[float]]:
    """Wall seconds for `clients` threads (one kept-alive connection each, connected before the clock
    starts) to send all batches between them, and each request's latency (s)."""
    from r3rag.retrieval.remote import RemoteRetriever

    latencies: list[float] = []
    lock, barrier = threading.Lock(), threading.Barrier(clients + 1)

    def client(c: int) -> None:
        remote = RemoteRetriever(url, timeout=timeout, max_batch=max_batch)
        remote.search(batches[0][:1], k)
        mine = []
        barrier.wait()
        for b in batches[c::clients]:
            t = time.perf_counter()
            remote.search(b, k)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies
