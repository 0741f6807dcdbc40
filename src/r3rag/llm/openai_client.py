"""An OpenAI-compatible chat-completions client: many requests in flight, retries, one result per request.

Synchronous methods over an asyncio loop that the client runs in its own thread: they work the
same from scripts, trainers and code that already runs an event loop, and connections are kept
alive across calls. A request that still fails after its retries comes back as a `ChatFailure`
value; `chat_many` never raises for one request.

Usage:
    client = ChatClient("https://api.deepseek.com/v1", "deepseek-chat", api_key_env="DEEPSEEK_API_KEY",
                        timeout=60, max_retries=5, concurrency=32, max_tokens=256)
    r = client.chat([{"role": "user", "content": "Hi"}], temperature=0.0)
    if r.ok: print(r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens)
    else: print(r.kind, r.error)                 # e.g. "http_500", "timeout", "malformed"
    results = client.chat_many([msgs1, msgs2, {"messages": msgs3, "temperature": 0.9}],
                               on_result=lambda i, r: bar.advance(), stop=["</search>"])
    client.close()                               # or: with ChatClient(...) as client: ...

Retried with exponential backoff and jitter: HTTP 429 (waiting at least its Retry-After), 408,
409, 5xx, timeouts (`timeout` is the whole request, not one socket read), connection errors, and
replies that are not a complete chat completion (malformed or truncated JSON). Not retried:
other 4xx, a bad request stays bad. 401/403/404 failures are marked `fatal` (wrong key, URL or
model: every request would fail the same way).

The API key is read from the environment variable named by `api_key_env` ("" = no key, e.g. a
local vLLM server) and kept only in the request headers: never in reprs, errors or results.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import httpx
import orjson

from r3rag.errors import UserError

RETRY_STATUS = {408, 409, 429}  # and every 5xx
FATAL_STATUS = {401, 403, 404}


@dataclass
class ChatResult:
    text: str
    finish_reason: str  # "stop", "length", ... as the server said
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 1
    seconds: float = 0.0
    ok: ClassVar[bool] = True


@dataclass
class ChatFailure:
    kind: str  # "http_<status>", "timeout", "connection", "malformed"
    error: str  # one line, safe to log
    attempts: int = 1
    seconds: float = 0.0
    fatal: bool = False
    ok: ClassVar[bool] = False


@dataclass
class _Retryable:
    kind: str
    error: str
    retry: bool
    retry_after: float | None = None
    fatal: bool = False


@dataclass
class ChatStats:
    requests: int = 0
    attempts: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: dict = field(default_factory=dict)  # kind -> count, over every failed attempt


class ChatClient:
    def __init__(self, base_url: str, model: str, api_key_env: str = "", timeout: float = 60.0,
                 max_retries: int = 4, concurrency: int = 32, backoff: float = 0.5, max_backoff: float = 30.0,
                 max_retry_after: float = 120.0, seed: int | None = None, **defaults):
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"chat endpoint {base_url!r}: expected an http:// or https:// URL")
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise UserError("chat client: concurrency >= 1, max_retries >= 0 and timeout > 0 are required")
        base = base_url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.model, self.timeout, self.max_retries, self.concurrency = model, timeout, max_retries, concurrency
        self.backoff, self.max_backoff, self.max_retry_after = backoff, max_backoff, max_retry_after
        self.defaults = defaults  # request fields sent with every request (temperature, max_tokens, ...)
        self._headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise UserError(f"environment variable {api_key_env} is not set (the API key for {base_url}); "
                                "set it, or use an empty api_key_env for an endpoint without a key")
            self._headers["Authorization"] = f"Bearer {key}"
        self.stats = ChatStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"ChatClient({self.url!r}, model={self.model!r}, concurrency={self.concurrency})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------ public, synchronous

    def chat(self, messages: list[dict], **params) -> ChatResult | ChatFailure:
        return self.chat_many([messages], **params)[0]

    def chat_many(self, requests: list, on_result: Callable[[int, ChatResult | ChatFailure], None] | None = None,
                  **params) -> list[ChatResult | ChatFailure]:
        """One result per request, in order. A request is a list of messages, or a dict with
        `messages` and per-request fields (e.g. temperature) that override `params`."""
        bodies = [self._body(r, params) for r in requests]

        async def go():
            async def one(i: int, body: dict):
                r = await self._one(body)
                if on_result is not None:
                    on_result(i, r)
                return r

            return await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))

        return self._run(go())

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._http is not None:
            asyncio.run_coroutine_threadsafe(self._http.aclose(), loop).result()
            self._http = None
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join()
        loop.close()

    # ------------------------------------------------------------ the loop thread

    def _run(self, coro):
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="chat-client", daemon=True)
                self._thread.start()
            loop = self._loop
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return fut.result()
        except BaseException:  # Ctrl-C while waiting: stop the requests in flight too
            fut.cancel()
            raise

    def _body(self, request, params: dict) -> dict:
        per = dict(request) if isinstance(request, dict) else {"messages": request}
        if "messages" not in per:
            raise ValueError("a chat request dict needs 'messages'")
        body = {"model": self.model, **self.defaults, **params, **per}
        return {k: v for k, v in body.items() if v is not None}

    async def _one(self, body: dict) -> ChatResult | ChatFailure:
        if self._http is None:  # created here so both live on the loop thread
            limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
            self._http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(self.timeout))
            self._sem = asyncio.Semaphore(self.concurrency)
        start = time.monotonic()
        self.stats.requests += 1
        async with self._sem:
            attempt = 0
            while True:
                attempt += 1
                self.stats.attempts += 1
                out = await self._attempt(body)
                if isinstance(out, ChatResult):
                    out.attempts, out.seconds = attempt, round(time.monotonic() - start, 3)
                    self.stats.prompt_tokens += out.prompt_tokens
                    self.stats.completion_tokens += out.completion_tokens
                    return out
                self.stats.errors[out.kind] = self.stats.errors.get(out.kind, 0) + 1
                if not out.retry or attempt > self.max_retries:
                    self.stats.failures += 1
                    tries = f"{attempt} attempt" + ("s" if attempt > 1 else "")
                    return ChatFailure(out.kind, f"{out.error} (after {tries})", attempt,
                                       round(time.monotonic() - start, 3), out.fatal)
                await asyncio.sleep(self._delay(attempt, out.retry_after))

    async def _attempt(self, body: dict) -> ChatResult | _Retryable:
        try:
            # wait_for bounds the whole request; httpx's own timeout only bounds each socket read.
            resp = await asyncio.wait_for(self._http.post(self.url, content=orjson.dumps(body), headers=self._headers),
                                          self.timeout)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            return _Retryable("timeout", f"no reply from {self.url} within {self.timeout:g}s", True)
        except httpx.TransportError as e:  # refused, reset, or a body cut short
            return _Retryable("connection", f"{self.url}: {type(e).__name__}: {_one_line(str(e))}", True)
        status = resp.status_code
        if status != 200:
            return _Retryable(f"http_{status}", f"{self.url}: HTTP {status}: {_one_line(resp.text)}",
                              status in RETRY_STATUS or status >= 500, self._retry_after(resp),
                              status in FATAL_STATUS)
        return _parse_completion(resp.content, self.url)

    def _retry_after(self, resp: httpx.Response) -> float | None:
        raw = resp.headers.get("retry-after")
        if raw is None:
            return None
        try:
            secs = float(raw)
        except ValueError:
            try:  # the HTTP-date form
                secs = email.utils.parsedate_to_datetime(raw).timestamp() - time.time()
            except (TypeError, ValueError):
                return None
        return min(max(secs, 0.0), self.max_retry_after)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; never sooner than the server's Retry-After."""
        # Jitter, so that requests which failed together do not all come back together.
        if retry_after is not None:
            return retry_after * (1 + 0.2 * self._rng.random())
        expo = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return expo * (0.5 + 0.5 * self._rng.random())


def _parse_completion(raw: bytes, url: str) -> ChatResult | _Retryable:
    try:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        text = choice["message"]["content"]
        if not isinstance(text, str):
            raise TypeError("message.content is not a string")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        return _Retryable("malformed", f"{url}: not a chat completion ({type(e).__name__}: "
                          f"{_one_line(str(e))}): {_one_line(raw.decode('utf-8', 'replace'))}", True)
    usage = data.get("usage") or {}
    return ChatResult(text, choice.get("finish_reason") or "stop", int(usage.get("prompt_tokens") or 0),
                      int(usage.get("completion_tokens") or 0))


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
