"""Protections of an HTTP server against slow and oversized clients, beyond uvicorn's own settings.

    BodyLimits             pure ASGI middleware: a request body over `max_bytes` is a 413, one not
                           received within `timeout` s of its headers a 408, both {"detail": ...}.
    with_header_deadline   (app, http) for `uvicorn.Config(app, http=http)`: a connection that has
                           not sent a request's headers `timeout` s after opening (or after its
                           previous response) is closed.

Why the header deadline is not a uvicorn setting: uvicorn has none (its issue #157 lists
`--timeout-request-start` as still to do). `timeout_keep_alive` starts only after a first
response and every received byte cancels it, so a client that connects and sends nothing, or
sends its headers a byte at a time (slow loris), holds a connection forever; and ASGI
middleware cannot see a request before its headers are complete. So the deadline lives in a
protocol that wraps uvicorn's h11 protocol, the one thing here that names a uvicorn internal
(`H11Protocol`, the class uvicorn's public `http="h11"` resolves to). It wraps it through
asyncio's public Protocol interface only: it forwards every callback, and learns when headers
are in from the ASGI side (the app is called) rather than from uvicorn's parser state.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

_DISCONNECT = {"type": "http.disconnect"}


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


def with_header_deadline(app, timeout: float, protocol=H11Protocol):
    """(app, http) for `uvicorn.Config(app, http=http, ...)`: `protocol` with a header deadline,
    and `app` wrapped to tell each connection when a request's headers are in and when it is done."""
    return _RequestSignals(app), functools.partial(HeaderDeadline, protocol=protocol, timeout=timeout)


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
