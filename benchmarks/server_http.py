"""The retrieval server's own CPU per /retrieve request under each HTTP parser, with and without the header deadline.

Four set-ups: uvicorn's h11 and httptools parsers (the latter as `server_guards.BoundedHttpTools`,
what the server runs when httptools is installed), each with the header deadline
(`server_guards.with_header_deadline`, as the server runs) and without it (the same uvicorn
settings, the parser alone). Each serves `make_app` in a subprocess over a retriever that returns
canned hits (3 a query, 560-character passages, the shared pools' mean), so that searching costs
nothing and the server's CPU is its HTTP, JSON and batching work. One kept-alive client
(RemoteRetriever) sends --requests requests of 64 queries; the server process's CPU time over
them (Linux /proc) is divided by the requests. The set-ups alternate for --rounds rounds; the
median of each is reported. CPU time, not wall time: it moves less on a shared machine.

Last line, JSON (ms of server CPU a request; null for httptools when it is not installed):
server_cpu_ms_h11, server_cpu_ms_h11_deadline, server_cpu_ms_httptools,
server_cpu_ms_httptools_deadline, deadline_cost_ms (with httptools, or h11 without it).

Usage:
    python benchmarks/server_http.py [--requests 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from server_load import free_port, wait_until_up  # beside this script

SETUPS = ("h11", "h11_deadline", "httptools", "httptools_deadline")


def serve(setup: str, port: int) -> None:
    """Run one set-up's server on 127.0.0.1:`port` until terminated."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from r3rag.core.protocol import Hit
    from r3rag.retrieval import server_guards
    from r3rag.retrieval.server import MAX_CONNECTIONS, bind_socket, make_app, uvicorn_config

    text = ("A passage of the length of the shared pools' mean, in words. " * 10)[:560]
    hits = [Hit(doc_id=f"d{i}", title="A page title", text=text, score=10.0 - i) for i in range(3)]

    class Canned:
        docs, settings = ["d"], {"backend": "canned"}

        def search(self, queries, k):
            return [hits[:k] for _ in queries]

    protocol = H11Protocol if setup.startswith("h11") else server_guards.BoundedHttpTools
    app = make_app(Canned())
    config = uvicorn_config(app, "warning", 10.0, MAX_CONNECTIONS, protocol)
    if not setup.endswith("_deadline"):
        config.app, config.http = app, protocol  # the same settings, without the HeaderDeadline wrapper
    uvicorn.Server(config).run(sockets=[bind_socket("127.0.0.1", port)])


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(setup: str, n: int) -> float:
    """Server CPU ms per request of 64 queries, for `n` requests after 50 to warm up."""
    from r3rag.retrieval.remote import RemoteRetriever

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", setup, str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc, timeout=30)
        remote = RemoteRetriever(url, timeout=10, retries=0)
        queries = [f"who directed the film number {i} of the series" for i in range(64)]
        for _ in range(50):
            remote.search(queries, 3)
        cpu0 = process_cpu(proc.pid)
        for _ in range(n):
            remote.search(queries, 3)
        cpu = process_cpu(proc.pid) - cpu0
        remote.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return cpu / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="timed requests of 64 queries a set-up and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", nargs=2, metavar=("SETUP", "PORT"), help=argparse.SUPPRESS)  # the server side
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]))
    from r3rag.retrieval import server_guards

    setups = [s for s in SETUPS if s.startswith("h11") or server_guards.HttpToolsProtocol is not None]
    runs: dict[str, list[float]] = {s: [] for s in setups}
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        for setup in setups:
            runs[setup].append(measure(setup, args.requests))
    med = {s: statistics.median(runs.get(s, [])) if runs.get(s) else None for s in SETUPS}
    for s in SETUPS:
        shown = ", ".join(f"{x:.3f}" for x in runs.get(s, [])) or "httptools not installed"
        print(f"{s:20s} server CPU ms/request: {shown}")
    base = "httptools" if med["httptools"] is not None else "h11"
    print(
        f"total {time.perf_counter() - t0:.0f}s; {args.requests} requests of 64 queries a round, {args.rounds} rounds"
    )
    print(
        json.dumps(
            {
                **{f"server_cpu_ms_{s}": None if med[s] is None else round(med[s], 3) for s in SETUPS},
                "deadline_cost_ms": round(med[f"{base}_deadline"] - med[base], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
