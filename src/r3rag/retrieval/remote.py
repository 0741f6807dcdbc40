"""A retriever that searches through a retrieval server (`r3rag serve-retriever`, or Search-R1's).

Batches are split into chunks of at most the server's `max_batch` (read once from
/health; Search-R1's server has none, so 512 is assumed). Connection errors, timeouts
and 5xx are retried with exponential backoff; a 4xx is the caller's mistake and is not.

Usage:
    r = RemoteRetriever("http://127.0.0.1:8000")
    hits = r.search(["Ava Smith works"], k=3)       # list[list[Hit]], like any retriever
"""

from __future__ import annotations

import time

import httpx

from r3rag.errors import UserError
from r3rag.protocol import Hit

FALLBACK_MAX_BATCH = 512


class RemoteRetriever:
    def __init__(self, url: str, timeout: float = 30, retries: int = 3, backoff: float = 0.5,
                 max_batch: int | None = None):
        self.url, self.retries, self.backoff = url.rstrip("/"), retries, backoff
        self.max_batch = max_batch
        self.client = httpx.Client(timeout=timeout)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        step = self._max_batch()
        out: list[list[Hit]] = []
        for lo in range(0, len(queries), step):
            payload = {"queries": list(queries[lo: lo + step]), "topk": k, "return_scores": True}
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
        tries = self.retries + 1
        last = ""
        for attempt in range(tries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = self.client.request(method, self.url + path, json=payload)
            except httpx.TransportError as e:  # connect errors, timeouts, dropped connections
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code >= 400:
                raise UserError(f"retrieval server at {self.url} rejected {path}: HTTP {resp.status_code} "
                                f"{_detail(resp)}")
            return resp.json()
        raise UserError(f"retrieval server at {self.url} unreachable after {tries} tries: {last}")

    def close(self) -> None:
        self.client.close()


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    return str(body.get("detail", body)) if isinstance(body, dict) else resp.text[:200]


def _hit(r: dict) -> Hit:
    doc = r["document"]
    title, sep, text = doc["contents"].partition("\n")  # the server writes "title\ntext"
    if not sep:  # no title line
        title, text = "", title
    return Hit(str(doc["id"]), float(r.get("score", 0.0)), title, text)
