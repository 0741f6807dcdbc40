"""Protections of an HTTP server against slow and oversized clients, beyond uvicorn's own settings.

    BodyLimits             pure ASGI middleware: a request body over `max_bytes` is a 413, one not
                           received within `timeout` s of its headers a 408, both {"detail": ...}.
    with_header_deadline   (app, http) for `uvicorn.Config(app, http=http)`: a connection that has
                           not sent a request's headers `timeout` s after opening (or after its
                           previous response) is closed.
    default_protocol       the HTTP protocol it wraps unless told: httptools' parser when installed
                           (BoundedHttpTools), else h11's, as uvicorn's own http="auto" chooses.

Why the header deadline is not a uvicorn setting: uvicorn has none (its issue #157 lists
`--timeout-request-start` as still to do). `timeout_keep_alive` starts only after a first
response and every received byte cancels it, so a client that connects and sends nothing, or
sends its headers a byte at a time (slow loris), holds a connection forever; and ASGI
middleware cannot see a request before its headers are complete. So the deadline lives in a
protocol that wraps uvicorn's HTTP protocol (any class that `http=` takes, one instance a
connection): it wraps it through asyncio's public Protocol interface only: it forwards every
callback, and learns when headers are in from the ASGI side (the app is called) rather than from
the parser's state.

Which parser: httptools (llhttp, in C) when installed. A /retrieve request of 64 queries cost the
server ~0.75 ms of CPU with it against ~0.99 with h11, the deadline included in both (canned
hits; `benchmarks/server_http.py`); the deadline itself costs ~0.03-0.05 ms. But uvicorn bounds
unfinished headers (`h11_max_incomplete_event_size`) for h11 only: httptools buffers a request
line and headers however long they grow. BoundedHttpTools applies that same setting to
httptools; it is the one subclass of a uvicorn protocol here, and what it overrides are
httptools' parser callbacks (its documented callback interface, which uvicorn's protocol
implements) and data_received. The uvicorn internals named: `H11Protocol` and
`HttpToolsProtocol`, the classes uvicorn's public `http="h11"` and `http="httptools"` resolve to.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the [server] extra installs httptools; without it uvicorn parses with h11 (as its http="auto" does)
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:
    HttpToolsProtocol = None

_DISCONNECT = {"type": "http.disconnect"}
H11_DEFAULT_MAX_INCOMPLETE = 16 * 1024  # h11's bound on unfinished headers, uvicorn's when not set


class BodyLimits:
    """Pure ASGI middleware bounding every HTTP request body in size and in time.

    A declared Content-Length over `max_bytes` is refused before the app runs; a chunked body is
    counted as the app reads it. A body still incomplete `timeout` s after the request started (a
    client trickling it) is a 408. Either answer carries `connection: close`, since the rest of
    the body is never read, and the app then reads a disconnect, its own answer going nowhere."""

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope["headers"])
        if declared is not None and declared > self.max_bytes:
            detail = f"request body of {declared} bytes is over the limit of {self.max_bytes}"
            return await send_detail(send, 413, detail, close=True)
        request = _LimitedRequest(receive, send, self.max_bytes, self.timeout)
        await self.app(scope, request.receive, request.send)


class _LimitedRequest:
    """One request's receive and send, as BodyLimits hands them to the app."""

    def __init__(self, receive, send, max_bytes: int, timeout: float):
        self._receive, self._send = receive, send
        self.max_bytes, self.timeout = max_bytes, timeout
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.size, self.body_done, self.started, self.rejected = 0, False, False, False

    async def receive(self):
        if self.rejected:
            return _DISCONNECT
        if self.body_done:  # e.g. an app waiting for http.disconnect: no deadline any more
            return await self._receive()
        try:
            async with asyncio.timeout_at(self.deadline):
                message = await self._receive()
        except TimeoutError:
            return await self._reject(408, f"request body not received within {self.timeout:g} s")
        if message["type"] != "http.request":
            self.body_done = True
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.max_bytes:
            return await self._reject(413, f"request body is over the limit of {self.max_bytes} bytes")
        self.body_done = not message.get("more_body", False)
        return message

    async def send(self, message) -> None:
        if self.rejected:  # the client already has its 408/413
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    async def _reject(self, status: int, detail: str):
        self.rejected = True
        if not self.started:  # an app that answers before reading its body gets its answer cut instead
            await send_detail(self._send, status, detail, close=True)
        return _DISCONNECT


def _content_length(headers) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None  # uvicorn's parser has already refused bad ones
    return None


async def send_detail(send, status: int, detail: str, close: bool = False) -> None:
    """An ASGI JSON response {"detail": detail}; `close` when the connection cannot be reused."""
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# The connection whose bytes are being parsed. uvicorn creates each request's ASGI task inside
# the protocol's data_received (or, for a pipelined request, inside the previous response's last
# send, itself in a task created there), and a new task copies the current context: so the app
# finds its own connection here. (uvicorn's `reset_contextvars=True` would cut this link.)
_CONNECTION: contextvars.ContextVar[HeaderDeadline | None] = contextvars.ContextVar("r3rag_connection", default=None)


def with_header_deadline(app, timeout: float, protocol=None):
    """(app, http) for `uvicorn.Config(app, http=http, ...)`: `protocol` (default_protocol() when None)
    with a header deadline, and `app` wrapped to tell each connection when a request's headers are
    in and when it is done."""
    protocol = default_protocol() if protocol is None else protocol
    return _RequestSignals(app), functools.partial(HeaderDeadline, protocol=protocol, timeout=timeout)


def default_protocol() -> type[asyncio.Protocol]:
    """BoundedHttpTools when httptools is installed, else uvicorn's H11Protocol (both take uvicorn's
    `h11_max_incomplete_event_size` as their bound on unfinished headers)."""
    return H11Protocol if HttpToolsProtocol is None else BoundedHttpTools


class HeaderDeadline(asyncio.Protocol):
    """An HTTP connection (`protocol`, built with uvicorn's arguments) that is closed unless each
    request's headers arrive within `timeout` s of the connection opening or going idle. Serve
    with `ws="none"`: a websocket upgrade would hand the transport to another protocol, past this one."""

    def __init__(self, *args, protocol, timeout: float, **kwargs):
        self._inner = protocol(*args, **kwargs)
        self.timeout = timeout
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._active = 0  # requests of this connection inside the app (more than one if pipelined)

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        token = _CONNECTION.set(self)
        try:
            self._inner.data_received(data)
        finally:
            _CONNECTION.reset(token)

    def eof_received(self):
        return self._inner.eof_received()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        self._active += 1
        self._disarm()

    def request_finished(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        if not self._transport.is_closing():
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if not self._transport.is_closing():
            self._transport.close()


class _RequestSignals:
    """ASGI middleware: tells the request's connection (see `_CONNECTION`) when the app has it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        connection = _CONNECTION.get()
        if connection is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        connection.request_started()
        try:
            await self.app(scope, receive, send)
        finally:
            connection.request_finished()


if HttpToolsProtocol is not None:

    class BoundedHttpTools(HttpToolsProtocol):
        """uvicorn's httptools protocol, with unfinished request lines and headers bounded as uvicorn
        bounds them for h11: more than `config.h11_max_incomplete_event_size` bytes (h11's 16 KiB
        when unset) is a 400 that closes the connection. httptools itself holds a header however
        long it grows (and copies the growing value again at each read), and tells nothing until
        the header is complete; so this counts the bytes of the reads between the parser's
        `on_message_begin` and `on_headers_complete`. A read that begins a request may also hold
        earlier requests' bodies (not counted: `on_body`) and, pipelined, whole header blocks
        (counted): an upper bound, exact for a client that waits for each response."""

        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            limit = config.h11_max_incomplete_event_size
            self.max_header_bytes = H11_DEFAULT_MAX_INCOMPLETE if limit is None else limit
            self._in_headers = False  # a request has begun and its headers are not complete
            self._began = False  # ... and it began in the read being parsed
            self._body_bytes = 0  # body bytes in the read being parsed
            self._header_bytes = 0  # the unfinished request line and headers held, at most

        def data_received(self, data: bytes) -> None:
            self._began, self._body_bytes = False, 0
            super().data_received(data)
            if not self._in_headers:
                self._header_bytes = 0
            elif self._began:
                self._header_bytes = len(data) - self._body_bytes
            else:
                self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
                msg = f"Request line and headers over {self.max_header_bytes} bytes."
                self.logger.warning(msg)
                self.send_400_response(msg)  # closes the connection

        def on_message_begin(self) -> None:
            self._in_headers = self._began = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_headers = False
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._body_bytes += len(body)
            super().on_body(body)
