"""Serving an index over HTTP: one uvicorn process, or N worker processes on one port.

`serve(index_dir, port=..., workers=1)` loads the index and runs the app of r3rag.retrieval.server
until interrupted. With `workers=N` it starts N spawned processes that each bind the one port with
SO_REUSEPORT (the kernel spreads new connections over them) and load the memory-mapped index, which
they then share through the page cache (see r3rag.retrieval.server's docstring).

Usage:
    serve("runs/index/default-abc/index", port=8000)      # blocks; 127.0.0.1 by default
    serve("runs/index/default-abc/index", port=8000, workers=4)
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from r3rag.retrieval.server import MAX_CONNECTIONS, bind_socket, make_app, uvicorn_config
from r3rag.util.heap import keep_freed_memory


def serve(
    index_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    header_timeout: float = 10.0,
    max_connections: int = MAX_CONNECTIONS,
    workers: int = 1,
    **limits,
) -> None:
    """Load the index in `index_dir` and serve it until interrupted (`workers` processes: module docstring)."""
    import uvicorn

    from r3rag.retrieval import load_retriever

    if workers > 1:
        options = {"log_level": log_level, "header_timeout": header_timeout, "max_connections": max_connections}
        return _serve_workers(index_dir, host, port, workers, options, limits)
    keep_freed_memory()  # before the search thread starts: see r3rag.util.heap
    sock = bind_socket(host, port)  # before loading, so a taken port fails fast
    retriever = load_retriever(index_dir)
    app = make_app(retriever, **limits)
    print(
        f"serving {index_dir} ({len(getattr(retriever, 'docs', []))} docs) at http://{host}:{port} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.Server(uvicorn_config(app, log_level, header_timeout, max_connections)).run(sockets=[sock])


def _serve_workers(index_dir, host: str, port: int, workers: int, options: dict, limits: dict) -> None:
    """`workers` spawned server processes on one SO_REUSEPORT port (see the module docstring)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    from r3rag.util.errors import UserError

    if not hasattr(socket, "SO_REUSEPORT"):
        raise UserError("serve-retriever: --workers needs SO_REUSEPORT (Linux, BSD, macOS)")
    _refuse_if_answered(host, port)
    reserve = bind_socket(host, port, reuse_port=True)  # bound, never listening: it holds the port, gets no connections
    port = reserve.getsockname()[1]
    ctx = mp.get_context("spawn")  # not fork: bm25s, torch and BLAS threads do not survive a fork
    ready = ctx.Queue()
    args = (str(index_dir), host, port, os.getpid(), ready, options, limits)
    procs = [ctx.Process(target=_worker, args=args, name=f"r3rag-retriever-{i}") for i in range(workers)]
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # so `finally` stops the workers
    try:
        for p in procs:
            p.start()
        docs = _await_workers(procs, ready)
        print(
            f"serving {index_dir} ({docs} docs) at http://{host}:{port} with {workers} workers (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        wait([p.sentinel for p in procs])
        dead = next(p for p in procs if p.exitcode is not None)
        raise UserError(f"serve-retriever: worker {dead.pid} exited with code {dead.exitcode}; stopped the others")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
        reserve.close()


def _refuse_if_answered(host: str, port: int) -> None:
    """SO_REUSEPORT lets a second server of the same user bind a port that another `--workers` server
    holds, and they would split its connections: refuse a port where something already answers."""
    from r3rag.util.errors import UserError

    if not port:
        return
    probe = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        socket.create_connection((probe, port), timeout=1).close()
    except OSError:
        return
    raise UserError(f"serve-retriever: cannot listen on {host}:{port}: a server already answers there")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _await_workers(procs, ready, timeout: float = 600.0) -> int:
    """Wait until every worker has loaded the index and listens; a worker's error is raised here."""
    import queue

    from r3rag.util.errors import UserError

    docs, waiting, deadline = None, len(procs), time.monotonic() + timeout
    while waiting:
        try:
            kind, value = ready.get(timeout=0.2)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode is not None]
            if dead:
                raise UserError(f"serve-retriever: worker {dead[0].pid} exited with code {dead[0].exitcode}") from None
            if time.monotonic() > deadline:
                raise UserError(f"serve-retriever: the workers did not load the index within {timeout:g} s") from None
            continue
        if kind == "error":
            raise UserError(value)
        docs, waiting = value, waiting - 1
    return docs


def _worker(index_dir: str, host: str, port: int, parent: int, ready, options: dict, limits: dict) -> None:
    """One server process: load the index (memory-mapped), listen on the shared port, serve."""
    import uvicorn

    from r3rag.retrieval import load_retriever
    from r3rag.util.errors import UserError

    keep_freed_memory()  # before any thread starts: see r3rag.util.heap
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    os.setpgrp()  # out of the terminal's group: Ctrl-C reaches the parent only, which stops us all in order
    try:
        sock = bind_socket(host, port, reuse_port=True)
        retriever = load_retriever(index_dir)
        app = make_app(retriever, **limits)
    except UserError as e:
        ready.put(("error", str(e)))
        return
    sock.listen(2048)  # only now does the kernel send this worker connections
    ready.put(("ready", len(getattr(retriever, "docs", []))))
    config = uvicorn_config(app, options["log_level"], options["header_timeout"], options["max_connections"])
    uvicorn.Server(config).run(sockets=[sock])


def _exit_with_parent(parent: int) -> None:
    """A worker whose parent died (SIGKILL leaves no chance to stop it) would hold the port: exit."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)
