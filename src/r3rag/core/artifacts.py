"""Versioned, crash-safe stage artifacts.

Layout: `runs/<stage>/<name>-<hash>/` holding the stage's outputs, `config.yaml` and
`manifest.json` (written last). Outputs are written into a hidden temp directory beside
the final one and renamed into place only when complete, so a killed stage never leaves
a directory that looks finished. A directory without a manifest is ignored. Outputs are
fsynced before the manifest is renamed into place (complete even after a power cut); temp
dirs of killed runs are removed by the next run of the same artifact; a disk that fills up
(or is read-only) is one clear `UserError` naming the file, with the temp dir removed.

Usage:
    inputs = {"world": resolve("world:latest", "world", runs_dir)}
    writer = ArtifactWriter("index", "demo", cfg_dict, inputs, runs_dir, seed=0)
    if writer.existing: return writer.existing          # same config + inputs: skip
    with writer:                                         # temp dir removed on error
        (writer.dir / "index").mkdir(); ...
        writer.metrics["docs"] = n
    ref = writer.ref                                     # the committed artifact
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from r3rag import __version__
from r3rag.util.durable import fsync_path
from r3rag.util.errors import UserError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
FILE = "file"  # an input that is a plain file, recorded by its content hash, not an artifact
# errors that mean "could not write here": disk full, quota, read-only, file too big
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
_HOST = socket.gethostname().replace("/", "_") or "host"
LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "bm25s", "tokenizers", "numpy")


@dataclass
class ArtifactRef:
    stage: str
    id: str
    path: Path
    manifest: dict

    @property
    def content_hash(self) -> str:
        return self.manifest["content_hash"]

    def as_input(self) -> dict:
        return {"id": self.id, "stage": self.stage, "path": str(self.path), "content_hash": self.content_hash}


def default_runs_dir() -> Path:
    return Path(os.environ.get("R3RAG_RUNS", "runs"))


def config_hash(stage: str, config: dict, inputs: dict[str, ArtifactRef]) -> str:
    payload = {
        "stage": stage,
        "config": config,
        "inputs": {k: v.content_hash for k, v in sorted(inputs.items())},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def hash_tree(root: Path) -> tuple[str, dict]:
    """sha256 of every file under root (except the manifest), and one hash over them all."""
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(root).as_posix()
            files[rel] = {"sha256": file_sha256(p), "bytes": p.stat().st_size}
    total = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return total, files


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: Path) -> dict | None:
    """The manifest, or None when there is no complete one (missing, unreadable, not ours)."""
    try:
        m = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: malformed JSON or not UTF-8
        return None
    ok = isinstance(m, dict) and isinstance(m.get("stage"), str) and isinstance(m.get("content_hash"), str)
    return m if ok else None


def built_seconds(manifest: dict) -> float | None:
    """How long the artifact took to build: its `seconds`, or its own `wall_seconds` metric where
    larger (synthesize artifacts published before 2026-12-02 timed only their publishing)."""
    figures = [manifest.get("seconds"), (manifest.get("metrics") or {}).get("wall_seconds")]
    figures = [f for f in figures if isinstance(f, (int, float))]
    return max(figures) if figures else None


def check_name(name: str) -> str:
    """Artifact names become directory names: no path separators, no hidden or huge names."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name or ""):
        raise UserError(
            f"name {name[:80]!r}: must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def list_artifacts(runs_dir: Path, stage: str | None = None) -> list[ArtifactRef]:
    """Complete artifacts (with a readable manifest), oldest first."""
    refs = []
    stages = [runs_dir / stage] if stage else sorted(p for p in runs_dir.glob("*") if p.is_dir())
    for sdir in stages:
        for d in sdir.glob("*") if sdir.is_dir() else []:
            if d.name.startswith(".") or not d.is_dir():
                continue
            m = load_manifest(d)
            if m and m.get("stage") == sdir.name:
                refs.append(ArtifactRef(sdir.name, d.name, d, m))
    return sorted(refs, key=lambda r: (r.manifest.get("finished_at", 0), r.id))


def resolve(ref: str, stage: str, runs_dir: Path | None = None, verify: bool = True) -> ArtifactRef:
    """Resolve `stage:latest`, `stage:<id>` or a directory path to a complete artifact."""
    runs_dir = runs_dir or default_runs_dir()
    if ":" in ref and not Path(ref).exists():
        want, _, which = ref.partition(":")
        if want != stage:
            raise UserError(f"input {ref!r}: expected a {stage!r} artifact")
        found = list_artifacts(runs_dir, stage)
        if which == "latest":
            if not found:
                raise UserError(
                    f"input {ref!r}: no complete {stage} artifact in {runs_dir}/{stage} (run `r3rag {stage}` first)"
                )
            art = found[-1]
        else:
            art = _by_id(ref, stage, which, found, runs_dir)
    else:
        path = Path(ref)
        if not path.is_dir():
            raise UserError(f"input {ref!r}: artifact directory not found")
        m = load_manifest(path)
        if m is None:
            raise UserError(f"input {ref!r}: no manifest.json (incomplete or not an artifact)")
        if m.get("stage") != stage:
            raise UserError(f"input {ref!r}: is a {m.get('stage')!r} artifact, expected {stage!r}")
        art = ArtifactRef(stage, path.name, path, m)
    if verify:
        actual, _ = hash_tree(art.path)
        if actual != art.content_hash:
            raise UserError(
                f"input {art.path}: content hash does not match its manifest (files changed after it was written)"
            )
    return art


def _by_id(ref: str, stage: str, which: str, found: list[ArtifactRef], runs_dir: Path) -> ArtifactRef:
    """The artifact whose id is `which` or ends with it; a suffix that fits several is an error
    (picking one would silently train or evaluate on the wrong artifact)."""
    matches = [a for a in found if a.id == which] or [a for a in found if which and a.id.endswith(which)]
    if not matches:
        raise UserError(f"input {ref!r}: no {stage} artifact with id {which!r} in {runs_dir}/{stage}")
    if len(matches) > 1:
        ids = [a.id for a in matches]
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")  # one readable line
        raise UserError(
            f"input {ref!r}: {len(ids)} {stage} artifacts in {runs_dir}/{stage} match ({shown}); give more of the id"
        )
    return matches[0]


def work_dir(final: Path) -> Path:
    """Where a stage keeps what a killed run resumes from (checkpoints, chunks, shards) between a
    kill and the rerun: `.work-<id>` beside the artifact's final folder `final` (runs/<stage>/<id>)."""
    return final.parent / f".work-{final.name}"


def journal_file(final: Path) -> Path:
    """A stage's journal of finished items (r3rag.util.journal) beside the artifact: `.journal-<id>.jsonl`."""
    return final.parent / f".journal-{final.name}.jsonl"


class ArtifactWriter:
    """Write a stage's outputs into a temp dir; `commit` (on clean exit) renames it into place."""

    def __init__(
        self,
        stage: str,
        name: str,
        config: dict,
        inputs: dict[str, ArtifactRef],
        runs_dir: Path | None = None,
        seed: int | None = None,
    ):
        self.stage, self.config, self.inputs, self.seed = stage, config, inputs, seed
        self.runs_dir = Path(runs_dir or default_runs_dir())
        self.hash = config_hash(stage, config, inputs)
        self.id = f"{check_name(name)}-{self.hash[:10]}"
        self.final = self.runs_dir / stage / self.id
        self.dir = self.runs_dir / stage / f".tmp-{self.id}-{_HOST}-{os.getpid()}"
        self.metrics: dict = {}
        self.extra: dict = {}
        self.ref: ArtifactRef | None = None
        m = load_manifest(self.final) if self.final.is_dir() else None
        self.existing = ArtifactRef(stage, self.id, self.final, m) if m else None
        # What was there before this command, so `discard` removes only what it created.
        self._made_dirs = [d for d in (self.final.parent, self.runs_dir) if not d.is_dir()]
        self._old_work = set(self._work_entries())

    def __enter__(self):
        self._remove_stale_temp_dirs()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.started = time.time()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.commit()
        except OSError as e:  # disk full during the commit: the same clear error as below
            raise self._write_error(e) from None
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
            raise self._write_error(exc) from None
        return False

    def discard(self) -> None:
        """After a failed command: remove the empty work files this command left for the artifact
        (a work dir without checkpoints, a journal without lines) and the stage and runs folders
        it created, if empty. What a rerun resumes from is kept."""
        for p in set(self._work_entries()) - self._old_work:
            if p.is_dir() and not any(q.is_file() for q in p.rglob("*")):
                shutil.rmtree(p, ignore_errors=True)
            elif p.is_file() and p.stat().st_size == 0:
                p.unlink(missing_ok=True)
        for d in self._made_dirs:
            try:
                d.rmdir()
            except OSError:  # not empty (something was published there), or already gone
                pass

    def _work_entries(self) -> list[Path]:
        """Hidden entries a stage keeps beside the artifact (`.work-<id>`, `.journal-<id>.jsonl`).
        Temp dirs are left out: `__exit__` removes this process's, and others' are not ours; so are
        build locks (r3rag.core.build_lock: removing one that another process waits on breaks it)."""
        parent = self.final.parent
        kept = (".tmp-", ".lock-")
        return [p for p in parent.glob(f".*-{self.id}*") if not p.name.startswith(kept)] if parent.is_dir() else []

    def _write_error(self, e: OSError) -> UserError:
        return UserError(
            f"{self.stage}: cannot write {e.filename or self.dir}: {e.strerror or e} "
            "(the incomplete output was removed; nothing was published)"
        )

    def _remove_stale_temp_dirs(self) -> None:
        """Temp dirs that killed runs of this artifact left on this host (their process is gone)."""
        for d in self.dir.parent.glob(f".tmp-{self.id}-{_HOST}-*"):
            pid = d.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)

    def commit(self) -> ArtifactRef:
        # Imported here, as in library_versions and code_version: `r3rag <stage> --help` imports this module.
        import platform

        import yaml

        (self.dir / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        content_hash, files = hash_tree(self.dir)
        finished = time.time()
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "stage": self.stage,
            "id": self.id,
            "config_hash": self.hash,
            "config": self.config,
            "inputs": {k: v.as_input() for k, v in self.inputs.items()},
            "outputs": files,
            "content_hash": content_hash,
            "metrics": self.metrics,
            **self.extra,
            "seed": self.seed,
            "code_version": code_version(),
            "libraries": library_versions(),
            "python": platform.python_version(),
            "compute": compute_share(),
            "started_at": self.started,
            "finished_at": finished,
            "seconds": round(finished - self.started, 2),
        }
        tmp_manifest = self.dir / (MANIFEST + ".part")
        tmp_manifest.write_text(json.dumps(manifest, indent=2, default=str))
        _fsync_tree(self.dir)  # every output on disk before the manifest says it is complete
        os.replace(tmp_manifest, self.dir / MANIFEST)
        if self.final.exists():  # an incomplete leftover with the same id
            shutil.rmtree(self.final)
        os.replace(self.dir, self.final)
        fsync_path(self.final.parent)
        self.ref = ArtifactRef(self.stage, self.id, self.final, manifest)
        return self.ref


def compute_share() -> dict:
    """What the build ran on, for reading its `seconds`: torch's CPU threads (where torch was
    loaded) and how many `r3rag run --jobs` workers shared the machine (R3RAG_JOBS; 1 alone)."""
    torch = sys.modules.get("torch")
    share = {"jobs": int(os.environ.get("R3RAG_JOBS") or 1)}
    if torch is not None:
        share["threads"] = torch.get_num_threads()
    return share


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fsync_path(p)
    fsync_path(root)


def library_versions() -> dict:
    from importlib import metadata

    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return out


def code_version() -> str:
    import subprocess

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+{sha}" if sha else __version__
