"""An OpenAI-compatible chat-completions client: many requests in flight, retries, one result per request.

The official `openai` SDK (`AsyncOpenAI`) sends the requests, retries them (`max_retries`) and
applies `timeout`; an `asyncio.Semaphore` bounds the requests in flight (`concurrency`). The
synchronous methods run it on an asyncio loop that the client keeps in its own thread: they work
the same from scripts, trainers and code that already runs an event loop, and connections are
kept alive across calls. A request that still fails after its retries comes back as a
`ChatFailure` value; `chat_many` never raises for one request.

Usage:
    client = ChatClient("https://api.deepseek.com/v1", "deepseek-chat", api_key_env="DEEPSEEK_API_KEY",
                        timeout=60, max_retries=5, concurrency=32, max_tokens=256)
    r = client.chat([{"role": "user", "content": "Hi"}], temperature=0.0)
    if r.ok: print(r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens)
    else: print(r.kind, r.error)                 # e.g. "http_500", "timeout", "malformed"
    results = client.chat_many([msgs1, msgs2, {"messages": msgs3, "temperature": 0.9}],
                               on_result=lambda i, r: bar.advance(), stop=["</search>"])
    client.close()                               # or: with ChatClient(...) as client: ...

Retried (the SDK's rule) with exponential backoff and jitter: HTTP 429 (waiting at least its
Retry-After; one over two minutes is not waited for, the request fails), 408, 409, 5xx, timeouts
(`timeout` is the whole request, not one socket read), connection errors, and replies that are
not a complete chat completion (malformed or truncated JSON). Not retried: other 4xx, a bad
request stays bad. 401/403/404 failures are marked `fatal` (wrong key, URL or model: every
request would fail the same way).

Kept from the hand-written client, on top of the SDK, each for a behaviour the SDK alone lacks:
- `_AttemptLog.send` (the SDK's HTTP client, public httpx API) sees every attempt. Measured with
  the SDK alone (openai 3.57): a 200 whose body is not JSON fails after 1 attempt (the SDK
  retries a body cut short, not a malformed one); the per-attempt kinds in `stats.errors` and a
  result's `attempts` are not reported; its timeout bounds each socket read, not the request.
- `R3ragAsyncOpenAI._calculate_retry_timeout` (an SDK hook, not public API) keeps `backoff`,
  `max_backoff`, `max_retry_after` and the seeded jitter: the SDK's own wait is fixed (0.5 s
  doubling to 8 s), so every retry in the tests would cost 0.375 s or more instead of 10 ms. If a
  future SDK renames the hook, its own schedule applies; tests/test_openai_client.py notices.
Speed is no reason to keep more (loopback, 2 cores busy with another job): 2000 requests at
concurrency 32 cost 1.6-1.7 ms of client CPU each against the hand-written client's 3.1-3.5 ms;
benchmarks/synthesis.py at concurrency 32 ran 27-34 questions/s (median 30.7, 7 runs) against
32-36 (median 32.4, 6 runs), within that machine's noise, and 1.21-1.25 against 1.22-1.25 at 1.

The API key is read from the environment variable named by `api_key_env` ("" = no key, e.g. a
local vLLM server: no Authorization header) and given only to the SDK, which is kept from the
OPENAI_* variables (key, organisation, project): never in reprs, errors or results.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import httpx2
import openai
import orjson

from r3rag.util.errors import UserError

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
class ChatStats:
    requests: int = 0
    attempts: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: dict = field(default_factory=dict)  # kind -> count, over every failed attempt


@dataclass
class _Attempts:
    """What every HTTP attempt of one request came to: (kind, error) per failed one."""

    count: int = 0
    failures: list = field(default_factory=list)


_NO_AUTH = {"Authorization": openai.Omit()}  # the SDK's way to send no key

# The SDK retries inside one call, so the attempts of a request are noted in its asyncio task's context.
_ATTEMPTS: contextvars.ContextVar[_Attempts] = contextvars.ContextVar("chat_attempts")


class ChatClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "",
        timeout: float = 60.0,
        max_retries: int = 4,
        concurrency: int = 32,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        max_retry_after: float = 120.0,
        seed: int | None = None,
        **defaults,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"chat endpoint {base_url!r}: expected an http:// or https:// URL")
        if concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise UserError("chat client: concurrency >= 1, max_retries >= 0 and timeout > 0 are required")
        base = base_url.rstrip("/").removesuffix("/chat/completions")
        self.base_url, self.url = base, base + "/chat/completions"
        self.model, self.timeout, self.max_retries, self.concurrency = model, timeout, max_retries, concurrency
        self.backoff, self.max_backoff, self.max_retry_after = backoff, max_backoff, max_retry_after
        self.defaults = defaults  # request fields sent with every request (temperature, max_tokens, ...)
        self._api_key = _read_key(api_key_env, base_url)
        self.stats = ChatStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sdk: R3ragAsyncOpenAI | None = None
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

    def chat_many(
        self, requests: list, on_result: Callable[[int, ChatResult | ChatFailure], None] | None = None, **params
    ) -> list[ChatResult | ChatFailure]:
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
        if self._sdk is not None:
            asyncio.run_coroutine_threadsafe(self._sdk.close(), loop).result()
            self._sdk = None
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

    def _start(self) -> None:
        """The SDK client and the semaphore, made on the loop thread that uses them."""
        limits = httpx2.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        http = _AttemptLog(self.url, self.timeout, limits=limits, timeout=self.timeout)
        self._sdk = R3ragAsyncOpenAI(
            self._retry_wait,
            base_url=self.base_url,
            http_client=http,
            timeout=self.timeout,
            max_retries=self.max_retries,
            **_sdk_auth(self._api_key),
        )
        self._sem = asyncio.Semaphore(self.concurrency)

    async def _one(self, body: dict) -> ChatResult | ChatFailure:
        if self._sdk is None:
            self._start()
        start = time.monotonic()
        self.stats.requests += 1
        tries = _Attempts()
        _ATTEMPTS.set(tries)  # this request's own task: gather runs each in a copy of the context
        async with self._sem:
            fields = dict(body)
            try:
                # Everything but model and messages goes as it is, unchecked: servers differ in what they take.
                reply = await self._sdk.chat.completions.create(
                    model=fields.pop("model"),
                    messages=fields.pop("messages"),
                    extra_body=fields,
                    extra_headers=None if self._api_key else _NO_AUTH,
                )
                out = _result(reply)
            except openai.APIError as e:
                out = self._failure(tries, e)
        out.attempts, out.seconds = max(tries.count, 1), round(time.monotonic() - start, 3)
        self._account(out, tries)
        return out

    def _failure(self, tries: _Attempts, e: openai.APIError) -> ChatFailure:
        # The last attempt's failure, as _AttemptLog saw it; the SDK's own error only if it never sent.
        kind, error = tries.failures[-1] if tries.failures else ("connection", f"{self.url}: {_one_line(str(e))}")
        n = max(tries.count, 1)
        tail = f" (after {n} attempt" + ("s)" if n > 1 else ")")
        status = int(kind[5:]) if kind.startswith("http_") else 0
        return ChatFailure(kind, error + tail, fatal=status in FATAL_STATUS)

    def _account(self, out: ChatResult | ChatFailure, tries: _Attempts) -> None:
        s = self.stats
        s.attempts += out.attempts
        for kind, _ in tries.failures:
            s.errors[kind] = s.errors.get(kind, 0) + 1
        if out.ok:
            s.prompt_tokens += out.prompt_tokens
            s.completion_tokens += out.completion_tokens
        else:
            s.failures += 1

    def _retry_wait(self, attempt: int, headers) -> float:
        """Exponential backoff with jitter; never sooner than the server's Retry-After."""
        # Jitter, so that requests which failed together do not all come back together.
        retry_after = self._retry_after(headers)
        if retry_after is not None:
            return retry_after * (1 + 0.2 * self._rng.random())
        expo = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return expo * (0.5 + 0.5 * self._rng.random())

    def _retry_after(self, headers) -> float | None:
        raw = headers.get("retry-after") if headers is not None else None
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


class R3ragAsyncOpenAI(openai.AsyncOpenAI):
    """AsyncOpenAI with ChatClient's wait between retries (see the module docstring for why)."""

    def __init__(self, retry_wait: Callable[[int, object], float], **kw):
        super().__init__(**kw)
        self._retry_wait = retry_wait

    def _calculate_retry_timeout(self, remaining_retries, options, response_headers=None) -> float:
        return self._retry_wait(_ATTEMPTS.get().count, response_headers)


class _MalformedReply(httpx2.TransportError):
    """A 200 that is not a complete chat completion: a transport error, so the SDK retries it."""


class _AttemptLog(httpx2.AsyncClient):
    """The SDK's HTTP client: notes what each attempt came to, bounds it by `deadline` as a whole
    and turns a malformed 200 into a retryable error (see the module docstring for why)."""

    def __init__(self, url: str, deadline: float, **kw):
        super().__init__(**kw)
        self._chat_url, self._deadline = url, deadline

    async def send(self, request: httpx2.Request, **kw) -> httpx2.Response:
        tries = _ATTEMPTS.get()
        tries.count += 1
        try:
            async with asyncio.timeout(self._deadline):
                resp = await super().send(request, **kw)
                await resp.aread()
        except (TimeoutError, httpx2.TimeoutException):
            tries.failures.append(("timeout", f"no reply from {self._chat_url} within {self._deadline:g}s"))
            raise httpx2.ReadTimeout("whole request timed out", request=request) from None
        except Exception as e:  # refused, reset, a body cut short, TLS: the SDK decides whether it is retried
            tries.failures.append(("connection", f"{self._chat_url}: {type(e).__name__}: {_one_line(str(e))}"))
            raise
        if not resp.is_success:
            tries.failures.append(
                (f"http_{resp.status_code}", f"{self._chat_url}: HTTP {resp.status_code}: {_one_line(resp.text)}")
            )
        elif (problem := _malformed(resp.content)) is not None:
            tries.failures.append(("malformed", f"{self._chat_url}: {problem}"))
            raise _MalformedReply(problem, request=request)
        return resp


def _malformed(raw: bytes) -> str | None:
    """Why `raw` is not a chat completion with a text reply, or None when it is one."""
    try:
        text = orjson.loads(raw)["choices"][0]["message"]["content"]
        if not isinstance(text, str):
            raise TypeError("message.content is not a string")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        return (
            f"not a chat completion ({type(e).__name__}: {_one_line(str(e))}): "
            f"{_one_line(raw.decode('utf-8', 'replace'))}"
        )
    return None


def _result(reply) -> ChatResult:
    choice, usage = reply.choices[0], reply.usage
    return ChatResult(
        choice.message.content,
        choice.finish_reason or "stop",
        int(usage and usage.prompt_tokens or 0),
        int(usage and usage.completion_tokens or 0),
    )


def _read_key(api_key_env: str, base_url: str) -> str:
    if not api_key_env:
        return ""
    key = os.environ.get(api_key_env, "")
    if not key:
        raise UserError(
            f"environment variable {api_key_env} is not set (the API key for {base_url}); "
            "set it, or use an empty api_key_env for an endpoint without a key"
        )
    return key


def _sdk_auth(key: str) -> dict:
    # Only the key from `api_key_env` goes out: the SDK would fill in OPENAI_API_KEY, OPENAI_ORG_ID and
    # OPENAI_PROJECT_ID from the environment. Without a key it insists on one: a placeholder, never sent
    # (each request omits the header, _NO_AUTH).
    return {
        "api_key": key or "no-key",
        "default_headers": {"OpenAI-Organization": openai.Omit(), "OpenAI-Project": openai.Omit()},
    }


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
