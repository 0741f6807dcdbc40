"""An HTTP retrieval server over any retriever, speaking Search-R1's `/retrieve` protocol.

    POST /retrieve  {"queries": ["...", ...], "topk": 3, "return_scores": true}
        -> {"result": [[{"document": {"id": ..., "contents": "title\\ntext"}, "score": 1.5}, ...], ...]}
           (without return_scores each hit is the document itself, as in Search-R1)
    GET  /health    -> {"status": "ok", "docs": n, "backend": "bm25", "max_batch": ..., ...}

Bad input is always a 4xx with {"detail": message}: malformed JSON (400), a body over
`max_body_bytes` (413), a body not received within `body_timeout` (408), and for the fields
(422) empty or non-list `queries`, a non-string or over-long query, a batch over `max_batch`,
`topk` outside 1..`max_topk`. Slow or greedy clients: a connection that has not sent a request's
headers `header_timeout` s after opening (or after its previous response) is closed, so idle or
byte-by-byte ("slow loris") connections cannot pile up; unfinished headers are buffered up to
MAX_HEADER_BYTES, more is a 400 that closes the connection; idle keep-alive connections close after
5 s; with `max_connections` connections open, further requests are answered 503 (uvicorn's
plain-text one; clients retry 5xx). Where each lives: the body limits are ASGI middleware
(`server_guards.BodyLimits`, for every route), the header deadline wraps uvicorn's HTTP protocol
(`server_guards.with_header_deadline`: uvicorn has no such setting), the rest are uvicorn settings.
The HTTP parser is httptools' when it is installed (the [server] extra has it; uvicorn's header-size
bound applied to it by `server_guards.BoundedHttpTools`), else h11's (`server_guards.default_protocol`).

Batching. Retrievers are fastest on big batches (bm25s scores a whole batch in one sparse
product), and a trainer's rollouts send many small concurrent requests. So request
handlers do not search: they validate, put (queries, topk, future) on a queue and await
the future. One background task, the batcher, takes the first waiting request, then any
others already queued, waits up to `window_s` more only while other requests are still
being received (so a lone client pays no window), and stops at `batch_queries` queries.
It runs ONE `retriever.search(all_queries, max_topk_of_batch)` in a single worker thread
(the event loop keeps accepting meanwhile; one thread because retrievers need not be
thread-safe) and hands each request its rows, cut to its own topk. Requests that arrive
during a search queue up and form the next batch, so under load batches grow by
themselves. (Cutting top-max_k to k equals searching with k up to the order of tied scores.)

Serving: `r3rag.retrieval.serving.serve` runs this app under uvicorn; with `workers=N` it starts N spawned processes that each bind the one port
with SO_REUSEPORT (the kernel spreads new connections over them) and each load the index: the
BM25 arrays and the DocStore are memory maps, so the workers share one copy through the page
cache; each keeps only its own vocabulary dict and small arrays. The parent binds the port first
(a taken port fails before anything loads; it never listens, so it gets no connections), waits
for every worker to load, and stops them all when one dies or it is stopped (Ctrl-C, SIGTERM);
a worker whose parent is gone exits. GET /health names the answering worker's `pid`.

Usage:
    app = make_app(load_retriever("runs/index/default-abc/index"))
    with running(app) as url: ...                          # a server in a thread (tests, benchmarks)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from r3rag.util.extras import require

# The [server] extra, checked before server_guards imports uvicorn: without it, `r3rag serve-retriever`
# stops with one line naming the extra (this module is imported only when a server is wanted).
FastAPI = require("fastapi", "server", "r3rag serve-retriever").FastAPI
require("uvicorn", "server", "r3rag serve-retriever")

from r3rag.retrieval.server_guards import BodyLimits, with_header_deadline  # noqa: E402

DEFAULT_TOPK = 3  # Search-R1's retrieval_topk when a request gives none
MAX_HEADER_BYTES = 8 * 1024  # an unfinished request line and headers (either parser); clients send ~200 bytes
MAX_CONNECTIONS = 512  # bounds memory: each in-flight request may hold up to max_body_bytes


class BadRequest(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class Batcher:
    """Merges concurrent requests into one `search` call (see the module docstring)."""

    def __init__(self, search, window_s: float = 0.003, batch_queries: int = 1024):
        self.search, self.window_s, self.batch_queries = search, window_s, batch_queries
        self.queue: asyncio.Queue | None = None
        self.arriving = 0  # requests inside a handler that have not been queued yet
        self.searches = 0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="r3rag-retrieve")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False)

    async def submit(self, queries: list[str], k: int) -> list[list]:
        fut = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((queries, k, fut))
        return await fut

    async def _loop(self) -> None:
        while True:
            batch = await self._collect()
            try:
                await self._run(batch)
            except Exception as e:  # a failing retriever fails its requests, not the server
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)

    async def _collect(self) -> list[tuple]:
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        n = len(batch[0][0])
        deadline = loop.time() + self.window_s
        while n < self.batch_queries:
            if self.queue.empty():
                remaining = deadline - loop.time()
                if self.arriving <= 0 or remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                item = self.queue.get_nowait()
            batch.append(item)
            n += len(item[0])
        return batch

    async def _run(self, batch: list[tuple]) -> None:
        queries = [q for qs, _, _ in batch for q in qs]
        k = max(k for _, k, _ in batch)
        self.searches += 1
        rows = await asyncio.get_running_loop().run_in_executor(self._executor, self.search, queries, k)
        lo = 0
        for qs, k_req, fut in batch:
            if not fut.done():  # the client may have gone away
                fut.set_result([row[:k_req] for row in rows[lo : lo + len(qs)]])
            lo += len(qs)


def make_app(
    retriever,
    max_batch: int = 512,
    max_topk: int = 100,
    max_query_chars: int = 2000,
    max_body_bytes: int | None = None,
    window_s: float = 0.003,
    batch_queries: int = 1024,
    body_timeout: float = 10.0,
) -> FastAPI:
    """The FastAPI app; `max_body_bytes` defaults to what max_batch maximal queries can need."""
    if max_body_bytes is None:
        max_body_bytes = max_batch * (6 * max_query_chars + 8) + 4096  # a char is at most 6 bytes escaped
    batcher = Batcher(retriever.search, window_s=window_s, batch_queries=max(batch_queries, max_batch))
    limits = {"max_batch": max_batch, "max_topk": max_topk, "max_query_chars": max_query_chars}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="r3rag retrieval", lifespan=lifespan)
    app.state.batcher = batcher
    stats = {"requests": 0, "queries": 0}

    @app.get("/health")
    async def health():
        docs = getattr(retriever, "docs", None)
        settings = getattr(retriever, "settings", {}) or {}
        return {
            "status": "ok",
            "pid": os.getpid(),  # which worker answered (serve-retriever --workers)
            "docs": len(docs) if docs is not None else settings.get("num_docs"),
            "backend": settings.get("backend", type(retriever).__name__),
            **limits,
            **stats,
            "searches": batcher.searches,
        }

    async def retrieve(scope, receive, send) -> None:
        """POST /retrieve as a bare ASGI handler (see FastRoutes): FastAPI's routing, request
        parsing and encoders cost more per request than the JSON work itself."""
        batcher.arriving += 1
        try:
            body = _parse_json(await _read_body(receive))
            queries, topk, with_scores = _validate(body, **limits)
        except BadRequest as e:
            return await _send_json(send, e.status, {"detail": e.detail})
        finally:
            batcher.arriving -= 1
        try:
            rows = await batcher.submit(queries, topk)
        except Exception as e:  # noqa: BLE001 - the retriever failed: a 5xx the client may retry
            return await _send_json(send, 500, {"detail": f"search failed: {type(e).__name__}: {e}"})
        stats["requests"] += 1
        stats["queries"] += len(queries)
        await _send_json(send, 200, {"result": [[_hit_json(h, with_scores) for h in row] for row in rows]})

    # added last = outermost: the body limits hold for the fast routes as for FastAPI's own
    app.add_middleware(FastRoutes, routes={("POST", "/retrieve"): retrieve})
    app.add_middleware(BodyLimits, max_bytes=max_body_bytes, timeout=body_timeout)
    return app


class FastRoutes:
    """Pure ASGI middleware: the routes in `routes` ((method, path) -> ASGI handler) skip FastAPI's
    routing, exception handlers and dependency machinery; they do their own validation and errors."""

    def __init__(self, app, routes: dict):
        self.app, self.routes = app, routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            handler = self.routes.get((scope["method"], scope["path"]))
            if handler is not None:
                return await handler(scope, receive, send)
        await self.app(scope, receive, send)


def _hit_json(h, with_scores: bool) -> dict:
    doc = {"id": h.doc_id, "contents": f"{h.title}\n{h.text}"}
    return {"document": doc, "score": h.score} if with_scores else doc


def _orjson_default(obj):
    if hasattr(obj, "item"):  # numpy scalars from a retriever: plain Python numbers
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


async def _send_json(send, status: int, obj) -> None:
    body = orjson.dumps(obj, default=_orjson_default)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive) -> bytes:
    chunks, more = [], True
    while more:  # its size and time limits: BodyLimits, around the app
        message = await receive()
        if message["type"] == "http.disconnect":  # gone, or cut off by BodyLimits (which has answered)
            raise BadRequest(400, "the client went away")
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _parse_json(body: bytes):
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadRequest(400, f"malformed JSON body: {e}") from None


def _validate(body, max_batch: int, max_topk: int, max_query_chars: int) -> tuple[list[str], int, bool]:
    if not isinstance(body, dict):
        raise BadRequest(422, "body must be a JSON object with 'queries'")
    queries = body.get("queries")
    if not isinstance(queries, list):
        raise BadRequest(422, "'queries' must be a list of strings")
    if not queries:
        raise BadRequest(422, "'queries' is empty")
    if len(queries) > max_batch:
        raise BadRequest(422, f"{len(queries)} queries is over max_batch={max_batch}; split the batch")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(422, f"queries[{i}] must be a string, got {type(q).__name__}")
        if len(q) > max_query_chars:
            raise BadRequest(422, f"queries[{i}] has {len(q)} characters, over max_query_chars={max_query_chars}")
    topk = body.get("topk")
    topk = DEFAULT_TOPK if topk is None else topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= max_topk:
        raise BadRequest(422, f"'topk' must be an integer from 1 to {max_topk}, got {topk!r}")
    with_scores = body.get("return_scores", False)
    if not isinstance(with_scores, bool):
        raise BadRequest(422, "'return_scores' must be true or false")
    return queries, topk, with_scores


def uvicorn_config(app, log_level: str, header_timeout: float, max_connections: int, protocol=None):
    """The uvicorn.Config every server here runs under (`running`, `serving.serve` and its workers): the
    header deadline around `app`, the header-size, connection and keep-alive limits of the module docstring.
    `protocol`: uvicorn's HTTP protocol class to wrap (tests); None = server_guards.default_protocol()."""
    import uvicorn

    app, http = with_header_deadline(app, header_timeout, protocol)
    return uvicorn.Config(
        app,
        http=http,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        proxy_headers=False,
        ws="none",  # no websocket routes; and an upgrade would swap HeaderDeadline out
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,  # BoundedHttpTools takes it too
        limit_concurrency=max_connections,
        timeout_keep_alive=5,
    )


@contextlib.contextmanager
def running(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    header_timeout: float = 10.0,
    max_connections: int = MAX_CONNECTIONS,
    protocol=None,
):
    """Serve `app` from a background thread; yields its base URL and stops it on exit. `protocol`: as
    for uvicorn_config."""
    import uvicorn

    sock = bind_socket(host, port)  # bound here so the port (0 = any free one) is known before serving
    server = uvicorn.Server(uvicorn_config(app, "warning", header_timeout, max_connections, protocol))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("retrieval server did not start")
            time.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def bind_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound (not listening) to host:port (0 = any free port); `reuse_port` lets a group of
    worker processes share the port. A taken port is a UserError naming it."""
    from r3rag.util.errors import UserError

    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so (else +40 ms per request)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # every socket of the group sets it; a server without it keeps its port to itself
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"serve-retriever: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
