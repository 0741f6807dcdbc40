"""One file from the Hugging Face hub at a pinned commit, resumable, checked, through huggingface_hub.

huggingface_hub does the HTTP: `get_hf_file_metadata` (a HEAD on `<endpoint>/datasets/<repo>/
resolve/<commit>/<path>`: X-Repo-Commit, the ETag, the size) and `http_get` (the GET, which
retries a dropped connection with a `Range` header from the byte it had reached). The bytes go
to `<dest>.<etag>.incomplete`, which this module keeps between runs: `hf_hub_download` (>= 1.x)
downloads to a file unique to each process and deletes it on failure, so a killed 570 MB
download would start again from zero; here the next run sends `Range: bytes=<size>-` instead.

A finished file is checked before it takes its name: against the manifest's sha256, else the
lock's (learned on first fetch), and always against the hub's ETag at that commit (the sha256
of an LFS file; the git blob sha1 of a file kept in git). A mismatch is refused in one line and
the bytes are deleted. `HF_ENDPOINT` and `HF_HUB_OFFLINE` are read when a download starts (not
only when huggingface_hub was imported), a token from `HF_TOKEN` or `hf auth login` is sent.

Usage:
    sha = download(Remote(repo_id, "dataset", revision), "hotpotqa/dev.jsonl", dest, expected, progress)
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from r3rag.util.errors import UserError

OFFLINE_HINT = "point R3RAG_DATA at a local copy of the data (export R3RAG_DATA=/path/to/data)"
MB = 1_000_000


@dataclass
class Remote:
    repo_id: str
    repo_type: str
    revision: str

    def where(self, path: str) -> str:
        return f"{self.repo_id}@{self.revision[:7]}:{path}"


def endpoint() -> str:
    """`HF_ENDPOINT` as it is now (huggingface_hub read it once, at import), else the hub."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return constants.is_offline_mode() or env in {"1", "ON", "YES", "TRUE"}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _client_errors(*names: str) -> tuple[type[BaseException], ...]:
    """The HTTP client's exception classes `names` from httpx and from httpx2: huggingface_hub 1.x
    talks through httpx, 2.x through httpx2 (pyproject allows both), and a refused connection
    must read as "cannot reach the hub" under either."""
    import importlib

    found = []
    for module in ("httpx", "httpx2"):
        try:
            client = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(client, n) for n in names if hasattr(client, n)]
    return tuple(found)


def download(remote: Remote, path: str, dest: Path, expected: str | None, progress=None) -> tuple[str, str]:
    """Fetch `path` at the pinned commit to `dest`; returns (sha256, how it was checked)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import OfflineModeIsEnabled

    where = remote.where(path)
    if offline():
        raise UserError(f"{where}: not downloaded yet and HF_HUB_OFFLINE is set; unset it to fetch, or {OFFLINE_HINT}")
    url = hf_hub_url(remote.repo_id, path, repo_type=remote.repo_type, revision=remote.revision, endpoint=endpoint())
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint())
    except (*_client_errors("ConnectError", "TimeoutException"), OfflineModeIsEnabled) as e:
        raise UserError(f"cannot reach the Hugging Face hub at {endpoint()} ({_short(e)}); {OFFLINE_HINT}") from None
    except Exception as e:  # the hub's own errors: repo, revision or file not found, gated, HTTP 5xx
        raise UserError(f"{where}: {_hub_error(e)}") from None
    if re.fullmatch(r"[0-9a-f]{40}", remote.revision) and meta.commit_hash not in (None, remote.revision):
        raise UserError(f"{where}: the hub answered for commit {meta.commit_hash}, not the pinned {remote.revision}")
    etag = (meta.etag or "").lower()
    if expected and re.fullmatch(r"[0-9a-f]{64}", etag) and etag != expected:
        raise UserError(f"{where}: the hub's sha256 {etag[:12]}... is not the manifest's {expected[:12]}...; refused")
    part = dest.with_name(f"{dest.name}.{(etag or 'noetag')[:16]}.incomplete")
    _get(url, part, meta.size, where, progress)
    sha, checked_by = _check(part, expected, etag, where)
    os.replace(part, dest)
    return sha, checked_by


def _get(url: str, part: Path, size: int | None, where: str, progress) -> None:
    """The GET into `part`, from the byte it already holds (a Range request when it holds some)."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part.parent.mkdir(parents=True, exist_ok=True)
    if size is not None and part.is_file() and part.stat().st_size > size:
        part.unlink()  # longer than the file: not a prefix of it
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"  # byte ranges of the file itself, not of a gzip stream
    with open(part, "ab") as raw:
        have = raw.tell()
        task = None
        if progress is not None:
            total = None if size is None else max(size // MB, 1)
            task = progress.add_task(f"fetch: {where}", total=total, completed=have // MB, unit="MB")
        sink = _Counting(raw, progress, task, have)
        try:
            http_get(url, sink, resume_size=have, headers=headers, expected_size=size, displayed_filename=part.name)
        except (*_client_errors("HTTPError"), OSError) as e:
            raw.flush()
            kept = part.stat().st_size / MB
            if isinstance(e, OSError) and "Consistency check failed" in str(e):
                part.unlink(missing_ok=True)
                raise UserError(
                    f"{where}: the download ended at the wrong size; refused (deleted); rerun to fetch it again"
                ) from None
            raise UserError(
                f"{where}: download interrupted ({_short(e)}); rerun to resume ({kept:.1f} MB kept)"
            ) from None
        if progress is not None:
            progress.update(task, completed=max(sink.bytes // MB, 1))


class _Counting:
    """The file http_get writes to, counting MB for the progress display as they arrive."""

    def __init__(self, raw, progress, task, have: int):
        self.raw, self.progress, self.task, self.bytes = raw, progress, task, have

    def write(self, chunk: bytes) -> int:
        self.bytes += len(chunk)
        if self.progress is not None:
            self.progress.update(self.task, completed=self.bytes // MB)
        return self.raw.write(chunk)

    def __getattr__(self, name):  # seek, tell, truncate, flush: the file's own
        return getattr(self.raw, name)


def _check(part: Path, expected: str | None, etag: str, where: str) -> tuple[str, str]:
    """The finished bytes against the manifest (or lock) and the hub's ETag; a mismatch deletes them."""
    sha = file_sha256(part)
    problem, checked_by = None, []
    if expected:
        checked_by.append("manifest sha256")
        if sha != expected:
            problem = f"sha256 {sha[:12]}... is not the expected {expected[:12]}..."
    if not problem and re.fullmatch(r"[0-9a-f]{64}", etag):
        checked_by.append("hub ETag (LFS sha256)")
        if sha != etag:
            problem = f"sha256 {sha[:12]}... is not the hub's ETag {etag[:12]}..."
    elif not problem and re.fullmatch(r"[0-9a-f]{40}", etag):
        checked_by.append("hub ETag (git blob sha1)")
        if _git_blob_sha1(part) != etag:
            problem = f"git blob sha1 is not the hub's ETag {etag[:12]}..."
    if problem:
        part.unlink(missing_ok=True)
        raise UserError(f"{where}: {problem}; refused (the download was deleted)")
    if not checked_by:
        raise UserError(f"{where}: neither the manifest nor the hub gave a hash to check it against; refused")
    return sha, " and ".join(checked_by)


def _hub_error(e: Exception) -> str:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, RevisionNotFoundError):
        return "the pinned commit is not in the repo (was the manifest's revision mistyped?)"
    if isinstance(e, RemoteEntryNotFoundError):
        return "no such file at the pinned commit"
    if isinstance(e, GatedRepoError):
        return "the repo is gated: accept its terms on the hub and log in (hf auth login)"
    if isinstance(e, RepositoryNotFoundError):
        return "repo not found (or private: log in with hf auth login)"
    if isinstance(e, HfHubHTTPError) and e.response is not None:
        code = e.response.status_code
        return f"the hub answered HTTP {code}" + ("; rerun later" if code >= 500 or code == 429 else "")
    return _short(e)


def _short(e: Exception) -> str:
    """An exception as a few words on one line."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
