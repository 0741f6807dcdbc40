"""What `r3rag data fetch` downloads and writes: the pinned manifest, and the lock file next to the data.

The manifest (data/flashrag.json in a checkout; `--manifest FILE` for another) names one hub
repo at one commit, the files taken from it with their size and sha256, and per data set the
files written from them (`outputs`: a deterministic sample of a split, a passage pool, an
unzipped corpus). Tests pass their own manifest, whose hashes are those of their stand-in files.

A file whose sha256 the manifest does not know (it was not knowable when the manifest was
written) is checked against the hub's ETag at the pinned commit and its sha256 is recorded on
first fetch in `<root>/flashrag.lock.json` (trust on first use); every later fetch checks the
file against the manifest, else against the lock.

Usage:
    m = load_manifest()                       # or load_manifest(Path("my.json"))
    names = m.resolve(["hotpotqa"])           # [] -> m.default; an unknown name: one line
    m.files_of("hotpotqa")                    # ["hotpotqa/dev.jsonl", "hotpotqa/train.jsonl"]
    lock = Lock.read(root); lock.files[path] = {...}; lock.write()
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from r3rag.util.errors import UserError

REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "data" / "flashrag.json"
LOCK_NAME = "flashrag.lock.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass
class Manifest:
    repo_id: str
    repo_type: str
    revision: str
    default: list[str]
    files: dict[str, dict]  # hub path -> {"size": int, "sha256": str | None}
    datasets: dict[str, dict]  # name -> {"about", "outputs": {path: spec}, "on_request"?}
    path: Path = Path()

    def resolve(self, names: list[str]) -> list[str]:
        """The data sets to fetch: `names` (or the default set, or `all` the QA sets), unknown -> one line."""
        if not names:
            return list(self.default)
        if names == ["all"]:
            return [n for n, d in self.datasets.items() if not d.get("on_request")]
        unknown = [n for n in names if n not in self.datasets]
        if unknown:
            known = ", ".join([*self.datasets, "all"])
            raise UserError(f"data fetch: unknown data set {unknown[0]!r}; known: {known}")
        return list(dict.fromkeys(names))

    def files_of(self, name: str) -> list[str]:
        """The hub files a data set's outputs are made from, in a stable order."""
        paths = []
        for spec in self.datasets[name]["outputs"].values():
            paths += [spec[k] for k in ("from", "unzip", "sample_of") if k in spec]
            paths += [s["from"] for s in spec.get("corpus_of", [])]
        return sorted(set(paths))

    def download_bytes(self, name: str) -> int:
        return sum(self.files[p]["size"] for p in self.files_of(name))


def load_manifest(path: Path | None = None) -> Manifest:
    path = Path(path) if path else MANIFEST
    if not path.is_file():
        raise UserError(f"data manifest {path} not found (it ships in the source checkout's data/; or pass --manifest)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    missing = [k for k in ("repo_id", "revision", "files", "datasets") if k not in raw]
    if missing:
        raise UserError(f"{path}: missing field {missing[0]!r}")
    m = Manifest(
        raw["repo_id"],
        raw.get("repo_type", "dataset"),
        raw["revision"],
        raw.get("default", []),
        raw["files"],
        raw["datasets"],
        path,
    )
    for name in m.datasets:
        for p in m.files_of(name):
            if p not in m.files:
                raise UserError(f"{path}: data set {name!r} reads {p}, which is not under 'files'")
            sha = m.files[p].get("sha256")
            if sha is not None and not _SHA256.fullmatch(sha):
                raise UserError(f"{path}: files[{p!r}].sha256 must be 64 lowercase hex digits or null")
    for name in m.default:
        if name not in m.datasets:
            raise UserError(f"{path}: default names unknown data set {name!r}")
    return m


@dataclass
class Lock:
    """`<root>/flashrag.lock.json`: what this data root holds, from which commit, with which hashes."""

    root: Path
    repo_id: str = ""
    revision: str = ""
    files: dict[str, dict] = field(default_factory=dict)  # hub path -> {"sha256", "size", "checked_by"}
    datasets: dict[str, dict] = field(default_factory=dict)  # name -> {"outputs": {path: {"rows", "sha256"}}}

    @classmethod
    def read(cls, root: Path) -> Lock:
        path = root / LOCK_NAME
        if not path.is_file():
            return cls(root)
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: malformed JSON ({e.msg}); delete it to fetch afresh") from None
        return cls(root, raw.get("repo_id", ""), raw.get("revision", ""), raw.get("files", {}), raw.get("datasets", {}))

    def for_manifest(self, m: Manifest) -> Lock:
        """This lock if it records the manifest's repo and commit, else an empty one: hashes learned
        at another commit say nothing about this one's files."""
        if (self.repo_id, self.revision) == (m.repo_id, m.revision):
            return self
        return Lock(self.root, m.repo_id, m.revision)

    def write(self) -> None:
        body = {"repo_id": self.repo_id, "revision": self.revision, "files": self.files, "datasets": self.datasets}
        tmp = self.root / f".{LOCK_NAME}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.root / LOCK_NAME)

    def complete(self, names: list[str]) -> bool:
        """Every named data set's outputs were written at this commit and are still there."""
        return all(
            name in self.datasets and all((self.root / p).is_file() for p in self.datasets[name]["outputs"])
            for name in names
        )
