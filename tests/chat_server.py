"""A real OpenAI-compatible chat-completions server on 127.0.0.1, with scripted replies and injectable faults.

For tests and benchmarks of anything that talks to an LLM endpoint (teachers, judges, policies).

Usage:
    from tests.chat_server import ChatServer, first_n

    with ChatServer(reply=lambda body: "<answer> Paris </answer>", delay=0.2) as srv:
        client = ChatClient(srv.url, "test-model")       # srv.url == "http://127.0.0.1:PORT/v1"
        ...
    srv.requests       # every request: {"body", "headers" (any case), "time", "fault"}

    # faults: a function of the request body -> None (answer normally) or one of FAULTS;
    # first_n(["429", "500"]) injects them into the first requests, in order.
    ChatServer(reply=..., faults=first_n(["429", "hang", "malformed", "truncated"]), hang_seconds=5)

`reply(body)` returns the assistant text, or a dict with `content` and optionally
`finish_reason` and `usage`. Without usage, tokens are counted as whitespace-separated words.

Faults: "429" (with `Retry-After: retry_after`), "500", "400", "401", "hang" (no reply for
`hang_seconds`, or until the server stops), "malformed" (HTTP 200, invalid JSON), "truncated"
(a Content-Length longer than the body sent, then the connection closes).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default (5) makes bursts of connections wait for SYN retries


FAULTS = ("429", "500", "400", "401", "hang", "malformed", "truncated")


def first_n(faults: list[str | None]) -> Callable[[dict], str | None]:
    """Faults for the first len(faults) requests, in arrival order; then none."""
    queue, lock = list(faults), threading.Lock()

    def pick(body: dict) -> str | None:
        with lock:
            return queue.pop(0) if queue else None

    return pick


def last_user_text(body: dict) -> str:
    users = [m["content"] for m in body.get("messages", []) if m.get("role") == "user"]
    return users[-1] if users else ""


class ChatServer:
    def __init__(
        self,
        reply: Callable[[dict], str | dict] = lambda body: "ok",
        faults: Callable[[dict], str | None] | None = None,
        delay: float = 0.0,
        retry_after: str = "1",
        hang_seconds: float = 30.0,
        model: str = "test-model",
    ):
        self.reply, self.faults, self.delay = reply, faults, delay
        self.retry_after, self.hang_seconds, self.model = retry_after, hang_seconds, model
        self.requests: list[dict] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), self._handler_class())
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()  # releases hung handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        return False

    def bodies(self) -> list[dict]:
        with self._lock:
            return [r["body"] for r in self.requests]

    # ------------------------------------------------------------ handling one request

    def _respond(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.rstrip("/") != "/v1/chat/completions":
            return self._send(h, 404, {"error": {"message": f"no route {h.path}"}})
        raw = h.rfile.read(int(h.headers.get("Content-Length", 0)))
        body = json.loads(raw)
        fault = self.faults(body) if self.faults else None
        with self._lock:
            # h.headers as it is: looked up without regard to case, as HTTP says (clients differ in case).
            self.requests.append({"body": body, "headers": h.headers, "time": time.monotonic(), "fault": fault})
        if self.delay:
            time.sleep(self.delay)
        match fault:
            case None:
                self._send(h, 200, self._completion(body))
            case "429":
                self._send(h, 429, {"error": {"message": "rate limited"}}, {"Retry-After": self.retry_after})
            case "500" | "400" | "401":
                self._send(h, int(fault), {"error": {"message": f"injected {fault}"}})
            case "hang":
                self._stop.wait(self.hang_seconds)
                h.close_connection = True
            case "malformed":
                self._send_raw(h, 200, b'{"choices": [{"message": {"content": "oops"', close=False)
            case "truncated":
                payload = json.dumps(self._completion(body)).encode()
                h.send_response(200)
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Length", str(len(payload)))
                h.end_headers()
                h.wfile.write(payload[: len(payload) // 2])
                h.close_connection = True
            case _:
                raise ValueError(f"unknown fault {fault!r} (known: {FAULTS})")

    def _completion(self, body: dict) -> dict:
        out = self.reply(body)
        out = {"content": out} if isinstance(out, str) else out
        words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        usage = out.get("usage") or {"prompt_tokens": words, "completion_tokens": len(out["content"].split())}
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": out["content"]},
                    "finish_reason": out.get("finish_reason", "stop"),
                }
            ],
            "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
        }

    @staticmethod
    def _send(h, status: int, payload: dict, headers: dict | None = None) -> None:
        ChatServer._send_raw(h, status, json.dumps(payload).encode(), headers=headers)

    @staticmethod
    def _send_raw(h, status: int, data: bytes, headers: dict | None = None, close: bool = False) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.close_connection = close

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like a real API server

            def do_POST(self):
                try:
                    server._respond(self)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): fine
                    self.close_connection = True

            def log_message(self, *args):  # keep test output clean
                pass

        return Handler
