"""The retrieval server's protections against slow and oversized clients (server_guards and the
uvicorn settings in server.uvicorn_config), on real sockets at loopback with short deadlines, with
each HTTP parser the server may run: h11 and httptools (BoundedHttpTools; skipped without httptools)."""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import time

import httpx
import pytest

from r3rag.core.protocol import Hit
from r3rag.retrieval import server_guards
from r3rag.retrieval.server import MAX_HEADER_BYTES, make_app, running
from r3rag.retrieval.server_guards import BodyLimits, default_protocol, with_header_deadline

DEADLINE = 0.5
BODY = b'{"queries":["a"]}'
REQUEST = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)


class Tiny:
    """A retriever of one document, optionally slow."""

    docs, settings = ["d"], {"backend": "tiny"}

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def search(self, queries, k):
        time.sleep(self.delay)
        return [[Hit(doc_id="d", title="t", text="x", score=1.0)] for _ in queries]


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _read_until_closed(sock: socket.socket, send: bytes = b"", every: float = 0.05, limit: float = 5.0):
    """Send `send` a byte every `every` s while reading; (what came back, seconds until the server closed)."""
    t0, reply, sent = time.monotonic(), b"", 0
    sock.settimeout(every)
    while time.monotonic() - t0 < limit:
        try:
            chunk = sock.recv(65536)
            if not chunk:
                return reply, time.monotonic() - t0
            reply += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            return reply, time.monotonic() - t0
        if sent < len(send):
            try:
                sock.send(send[sent : sent + 1])
                sent += 1
            except OSError:
                return reply, time.monotonic() - t0
    raise AssertionError(f"connection still open after {limit} s; got {reply[:200]!r}")


def _responses(sock: socket.socket, n: int) -> list[bytes]:
    """The status lines of the next `n` responses on a kept-alive connection."""
    sock.settimeout(5)
    data, lines = b"", []
    while len(lines) < n:
        head, sep, rest = data.partition(b"\r\n\r\n")
        lengths = [int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")]
        length = lengths[0] if lengths else 0
        if sep and len(rest) >= length:  # one whole response
            lines.append(head.split(b"\r\n")[0])
            data = rest[length:]
            continue
        chunk = sock.recv(65536)
        assert chunk, f"closed early: {data!r}"
        data += chunk
    return lines


@pytest.fixture(scope="module", params=["h11", "httptools"])
def protocol(request):
    """uvicorn's HTTP protocol class for `running(protocol=...)`."""
    if request.param == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    if server_guards.HttpToolsProtocol is None:
        pytest.skip("httptools is not installed (the [server] extra installs it)")
    return server_guards.BoundedHttpTools


@pytest.fixture(scope="module")
def url(protocol):
    with running(make_app(Tiny(), max_body_bytes=1000), header_timeout=DEADLINE, protocol=protocol) as url:
        yield url


@pytest.mark.parametrize("kind", ["nothing", "headers a byte at a time"])
def test_slow_connections_are_closed_at_the_header_deadline(url, kind):
    with _connect(url) as s:
        reply, seconds = _read_until_closed(s, send=b"" if kind == "nothing" else REQUEST)
    assert reply == b"" and DEADLINE * 0.9 <= seconds < DEADLINE + 1.0, (reply, seconds)


def test_kept_alive_connection_gets_a_fresh_deadline_per_request(url):
    with _connect(url) as s:
        for _ in range(3):  # 3 x 0.6 deadlines in all, each request within a deadline of the previous response
            time.sleep(DEADLINE * 0.6)
            s.sendall(REQUEST)
            assert _responses(s, 1) == [b"HTTP/1.1 200 OK"]
            answered = time.monotonic()
        reply, _ = _read_until_closed(s)  # then idle: closed a deadline after the last response
    assert reply == b"" and DEADLINE * 0.9 <= time.monotonic() - answered < DEADLINE + 1.0


def test_pipelined_requests_are_all_answered(url):
    with _connect(url) as s:
        s.sendall(REQUEST * 3)
        assert _responses(s, 3) == [b"HTTP/1.1 200 OK"] * 3


def test_pipelined_request_is_not_cut_when_the_previous_one_finishes_during_it(protocol):
    async def app(scope, receive, send):  # /a works on after its response; /slow answers after 2 deadlines
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        if scope["path"] == "/slow":
            await asyncio.sleep(DEADLINE * 2)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        await asyncio.sleep(0.1)

    with running(app, header_timeout=DEADLINE, protocol=protocol) as url, _connect(url) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _responses(s, 2) == [b"HTTP/1.1 200 OK"] * 2


def test_a_slow_search_is_not_cut_by_the_header_deadline(protocol):
    with running(make_app(Tiny(delay=DEADLINE * 2)), header_timeout=DEADLINE, protocol=protocol) as url:
        resp = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 1})
    assert resp.status_code == 200 and resp.json()["result"][0][0]["id"] == "d"


def test_a_slow_body_is_a_408_and_the_connection_closes(protocol):
    app = make_app(Tiny(), body_timeout=DEADLINE)
    with running(app, header_timeout=30, protocol=protocol) as url, _connect(url) as s:
        s.sendall(REQUEST[:-5])  # headers and most of the body, never the rest
        reply, seconds = _read_until_closed(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), head
    assert json.loads(body) == {"detail": f"request body not received within {DEADLINE:g} s"}
    assert DEADLINE * 0.9 <= seconds < DEADLINE + 1.0


def test_body_limits_hold_for_fastapi_routes_too(url):
    resp = httpx.post(f"{url}/health", content=b"x" * 1001)
    assert resp.status_code == 413 and "over the limit of 1000" in resp.json()["detail"]
    assert resp.headers["connection"] == "close"


@pytest.mark.parametrize("writes", [1, 9])
def test_endless_headers_are_a_400_that_closes(url, writes):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 1)
    with _connect(url) as s:  # unfinished headers past MAX_HEADER_BYTES are not buffered on and on
        step = -(-len(head) // writes)
        for i in range(0, len(head), step):  # in one write, or in several reads that add up
            s.sendall(head[i : i + step])
            time.sleep(0.01)
        reply, seconds = _read_until_closed(s)
    assert seconds < DEADLINE * 0.9  # refused at once, not at the deadline
    assert reply.startswith(b"HTTP/1.1 400"), reply[:100]


def test_big_bodies_and_pipelined_requests_are_not_taken_for_long_headers(protocol):
    """BoundedHttpTools counts the reads between a request's start and its headers' end: neither a
    body read with its headers nor pipelined requests in one read may count as unfinished headers."""
    big = b'{"queries":["' + b"a" * 1000 + b'"]}'  # one query, 4 x MAX_HEADER_BYTES of body with padding
    big += b" " * (4 * MAX_HEADER_BYTES)
    post = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with running(make_app(Tiny()), header_timeout=DEADLINE, protocol=protocol) as url, _connect(url) as s:
        s.sendall(post % len(big) + big)
        assert _responses(s, 1) == [b"HTTP/1.1 200 OK"]
        s.sendall(post % len(big) + big + REQUEST[:20])  # a read of a body and the next request's start
        time.sleep(0.1)
        s.sendall(REQUEST[20:])
        assert _responses(s, 2) == [b"HTTP/1.1 200 OK"] * 2
        s.sendall((post % len(big) + big) * 3 + REQUEST * 40)  # pipelined: 43 requests in ~110 KB
        assert _responses(s, 43) == [b"HTTP/1.1 200 OK"] * 43


def test_requests_beyond_max_connections_are_503(protocol):
    with running(make_app(Tiny()), max_connections=3, protocol=protocol) as url:
        idle = [_connect(url), _connect(url)]
        time.sleep(0.1)  # accepted
        with httpx.Client() as client:
            assert client.get(f"{url}/health").status_code == 503  # the 3rd connection
        for s in idle:
            s.close()
        time.sleep(0.1)
        assert httpx.get(f"{url}/health").status_code == 200


def test_body_limits_cut_a_chunked_body_and_drop_the_apps_answer():
    sent, seen = [], []

    async def app(scope, receive, send):
        while (message := await receive())["type"] == "http.request" and message["more_body"]:
            pass
        seen.append(message["type"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():  # a chunked body of 3 x 400 bytes
        return {"type": "http.request", "body": b"x" * 400, "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "headers": []}
    asyncio.run(BodyLimits(app, max_bytes=1000, timeout=5)(scope, receive, send))
    assert seen == ["http.disconnect"] and [m.get("status") for m in sent] == [413, None]
    assert json.loads(sent[1]["body"]) == {"detail": "request body is over the limit of 1000 bytes"}


def test_header_deadline_and_header_bound_are_the_only_uses_of_uvicorn_internals():
    """uvicorn has no header timeout (its issue #157, `--timeout-request-start`), so HeaderDeadline
    wraps uvicorn's HTTP protocol class (`H11Protocol` or `HttpToolsProtocol`), through
    asyncio.Protocol's methods only; and uvicorn bounds unfinished headers for h11 only, so
    BoundedHttpTools subclasses `HttpToolsProtocol`, overriding httptools' parser callbacks and
    data_received. When this fails because uvicorn gained such a setting, use it and drop the class;
    when it fails because those methods moved, BoundedHttpTools needs a look."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    timeouts = {p for p in inspect.signature(uvicorn.Config).parameters if p.startswith("timeout")}
    assert timeouts == {
        "timeout_keep_alive",
        "timeout_notify",
        "timeout_graceful_shutdown",
        "timeout_worker_healthcheck",
    }, timeouts
    assert issubclass(H11Protocol, asyncio.Protocol)
    _, http = with_header_deadline(None, 1.0)
    assert http.keywords["protocol"] is default_protocol()
    if server_guards.HttpToolsProtocol is None:
        assert default_protocol() is H11Protocol
        return
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert default_protocol() is server_guards.BoundedHttpTools
    assert issubclass(server_guards.BoundedHttpTools, HttpToolsProtocol)
    for name in ("data_received", "on_message_begin", "on_headers_complete", "on_body", "send_400_response"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
