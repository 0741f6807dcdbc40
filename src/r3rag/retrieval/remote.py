"""A retriever that searches through a retrieval server (`r3rag serve-retriever`, or Search-R1's).

Batches are split into chunks of at most the server's `max_batch` (read once from
/health; Search-R1's server has none, so 512 is assumed). Connection errors, timeouts
and 5xx are retried with exponential backoff; a 4xx is the caller's mistake and is not.

Usage:
    r = RemoteRetriever("http://127.0.0.1:8000")
    hits = r.search(["Ava Smith works"], k=3)       # list[list[Hit]], like any retriever
"""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

import orjson

from r3rag.core.protocol import Hit
from r3rag.util.errors import UserError

FALLBACK_MAX_BATCH = 512
_JSON = {"content-type": "application/json"}
# what a kept-alive connection that the server has meanwhile closed fails with, before any response
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class RemoteRetriever:
    """Thread-safe: each request takes a kept-alive connection from a small pool (one per
    concurrent caller). Plain `http.client`, not httpx: at batch 64 httpx's own per-request
    work costs about as much CPU as the server's search (benchmarks/retrieval.py)."""

    def __init__(
        self, url: str, timeout: float = 30, retries: int = 3, backoff: float = 0.5, max_batch: int | None = None
    ):
        self.url, self.retries, self.backoff = url.rstrip("/"), retries, backoff
        self.max_batch, self.timeout = max_batch, timeout
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"retrieval server url {url!r} is not an http(s) URL")
        self._conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._port, self._prefix = parts.hostname, parts.port, parts.path
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        step = self._max_batch()
        out: list[list[Hit]] = []
        for lo in range(0, len(queries), step):
            payload = {"queries": list(queries[lo : lo + step]), "topk": k, "return_scores": True}
            out.extend([_hit(r) for r in row] for row in self._request("POST", "/retrieve", payload)["result"])
        return out

    def _max_batch(self) -> int:
        if self.max_batch is None:
            try:
                self.max_batch = int(self._request("GET", "/health").get("max_batch") or FALLBACK_MAX_BATCH)
            except UserError as e:
                if "unreachable" in str(e):
                    raise
                self.max_batch = FALLBACK_MAX_BATCH  # a server without /health
        return self.max_batch

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        body = None if payload is None else orjson.dumps(payload)
        tries = self.retries + 1
        last = ""
        for attempt in range(tries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, data = self._send(method, path, body)
            except (OSError, http.client.HTTPException) as e:  # connect errors, timeouts, dropped connections
                last = f"{type(e).__name__}: {e}"
                continue
            if status >= 500:
                last = f"HTTP {status}: {data[:200].decode(errors='replace')}"
                continue
            if status >= 400:
                raise UserError(f"retrieval server at {self.url} rejected {path}: HTTP {status} {_detail(data)}")
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError as e:
                raise UserError(f"retrieval server at {self.url} sent malformed JSON for {path}: {e}") from None
        raise UserError(f"retrieval server at {self.url} unreachable after {tries} tries: {last}")

    def _send(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        """One request on a pooled connection; a stale kept-alive one is replaced once, silently."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            if conn is None:
                conn = self._conn_class(self._host, self._port, timeout=self.timeout)
            try:
                conn.request(method, self._prefix + path, body=body, headers=_JSON if body is not None else {})
                resp = conn.getresponse()
                data = resp.read()
            except _STALE:
                conn.close()
                if reused:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if resp.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return resp.status, data

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _detail(data: bytes) -> str:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data[:200].decode(errors="replace")
    return str(body.get("detail", body)) if isinstance(body, dict) else data[:200].decode(errors="replace")


def _hit(r: dict) -> Hit:
    doc = r["document"]
    title, sep, text = doc["contents"].partition("\n")  # the server writes "title\ntext"
    if not sep:  # no title line
        title, text = "", title
    return Hit(str(doc["id"]), float(r.get("score", 0.0)), title, text)
