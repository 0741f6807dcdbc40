"""A stand-in Hugging Face hub on 127.0.0.1: the `resolve` endpoint huggingface_hub downloads files from.

    HEAD/GET /datasets/<repo>/resolve/<revision>/<path>

answers as the hub does for a file at a commit: `X-Repo-Commit`, an `ETag` (a file marked LFS:
its sha256, also as `X-Linked-Etag`, with `X-Linked-Size`; any other: its git blob sha1),
`Content-Length`, `Accept-Ranges: bytes`, and a GET with `Range: bytes=N-` gets 206 from byte N.
An unknown revision or file is a 404 with the hub's `X-Error-Code` (RevisionNotFound,
EntryNotFound), which huggingface_hub turns into its own errors.

Faults, per file, one for each GET in turn: `"drop:N"` sends the headers of the whole file and N
bytes, then closes the connection (a download cut in the middle); an int is that HTTP status.

Usage:
    with HubServer("org/data", "a" * 40, {"x/dev.jsonl": b"..."}, lfs={"x/dev.jsonl"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hub.faults["x/dev.jsonl"] = ["drop:100", 503]
        ...
    hub.requests     # [(method, path, headers)], headers with lower-case names
"""

from __future__ import annotations

import hashlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class HubServer:
    def __init__(self, repo_id: str, revision: str, files: dict[str, bytes], lfs: set[str] = frozenset()):
        self.repo_id, self.revision, self.files, self.lfs = repo_id, revision, dict(files), set(lfs)
        self.faults: dict[str, list] = {}
        self.etags: dict[str, str] = {}  # path -> an ETag to announce instead of the true one
        self.requests: list[tuple[str, str, dict]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def gets(self, path: str) -> list[dict]:
        """The headers of every GET of `path`, in order."""
        return [h for m, p, h in self.requests if m == "GET" and p == path]

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        method = "GET" if body else "HEAD"
        prefix = f"/datasets/{self.repo_id}/resolve/"
        url_path = unquote(h.path.split("?")[0])
        revision, _, path = url_path[len(prefix) :].partition("/") if url_path.startswith(prefix) else ("", "", "")
        with self._lock:
            self.requests.append((method, path, {k.lower(): v for k, v in h.headers.items()}))
            fault = self.faults.get(path, []).pop(0) if body and self.faults.get(path) else None
        if not url_path.startswith(prefix):
            return self._error(h, 404, "RepoNotFound")
        if revision != self.revision:
            return self._error(h, 404, "RevisionNotFound")
        if path not in self.files:
            return self._error(h, 404, "EntryNotFound")
        if isinstance(fault, int):
            return self._error(h, fault, None)
        data = self.files[path]
        start = 0
        rng = h.headers.get("Range", "")
        if body and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes=") : -1])
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", self.revision)
        h.send_header("Accept-Ranges", "bytes")
        if path in self.lfs:
            etag = self.etags.get(path) or hashlib.sha256(data).hexdigest()
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
        else:
            etag = self.etags.get(path) or git_blob_sha1(data)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if not body:
            return
        if isinstance(fault, str) and fault.startswith("drop:"):
            h.wfile.write(data[start : start + int(fault[5:])])
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)  # the rest never comes
            h.close_connection = True
            return
        h.wfile.write(data[start:])

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str | None) -> None:
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
            h.send_header("X-Error-Message", code)
        h.send_header("Content-Length", "0")
        h.end_headers()
