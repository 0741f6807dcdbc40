"""`r3rag data fetch` / `r3rag data list` / `make data`: the real QA sets, from the hub into one data root.

For each data set the manifest (r3rag.data.manifest) names, the hub files at the pinned commit
go to `<root>/flashrag/<path>` (r3rag.data.download: resumable, hash-checked), then the files the
pipelines read are written next to them (r3rag.data.outputs), under the same relative names as the
shared offline copy (`hotpotqa/dev_distractor_ircot_subsample.jsonl`, `corpus/...`), so every
pipeline, test and benchmark reads either root unchanged. Their content is FlashRAG's questions
drawn by a fixed rank (same counts and kinds as the offline copy, not its exact questions);
`<root>/README.md` says what each file holds. `<root>/flashrag.lock.json` records the commit,
each hub file's sha256 and each data set written; a file already there is re-checked, not
fetched again, so a rerun after an interruption continues where it stopped.

The root is `--root`, else `$R3RAG_DATA`, else `data/fetched` (r3rag.data.shared), which the
pipelines read when `$R3RAG_DATA` is not set.

Usage:
    root = fetch(["hotpotqa"])                 # [] = the manifest's default set; ["all"] = every QA set
    root = ensure()                            # `--if-missing`: nothing when a data root is there
    print_status(fetch_root())                 # `r3rag data list`
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from r3rag.data.download import Remote, download, file_sha256
from r3rag.data.manifest import LOCK_NAME, Lock, Manifest, load_manifest
from r3rag.data.outputs import write_outputs
from r3rag.data.shared import fetch_root
from r3rag.util.errors import UserError


def human(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fetch(
    names: list[str],
    root: Path | None = None,
    manifest: Path | None = None,
    yes: bool = False,
    console=None,
    confirm: Callable[[str], bool] | None = None,
) -> Path:
    """Download and write the named data sets into `root`; returns the root."""
    from rich.console import Console

    from r3rag.util.progress import Progress, say

    m = load_manifest(manifest)
    names = m.resolve(names)
    root = Path(root or fetch_root()).expanduser()
    console = console or Console(stderr=True)
    for name in names:
        if m.datasets[name].get("on_request"):
            _ask(m, name, yes, console, confirm)
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root):
        lock = Lock.read(root).for_manifest(m)
        remote = Remote(m.repo_id, m.repo_type, m.revision)
        with Progress(console) as progress:
            for name in names:
                for path in m.files_of(name):
                    _hub_file(m, lock, remote, path, root, progress)
                written = write_outputs(name, m.datasets[name]["outputs"], root / "flashrag", root, _tag(m), progress)
                lock.datasets[name] = {"outputs": written}
                lock.write()
                say(console, f"data: {name}: " + ", ".join(f"{p} ({n} rows)" for p, n in written.items()))
        _readme(m, lock, root)
    return root


def _tag(m: Manifest) -> Callable[[str], str]:
    """Each question's `metadata.source`, as the offline copy writes it: `<repo>:<path>@<commit>`."""
    return lambda path: f"{m.repo_id}:{path}@{m.revision}"


def ensure(names: list[str] | None = None, manifest: Path | None = None, console=None) -> Path:
    """`--if-missing`: the data root the pipelines would read if it is there (a local copy as it is,
    a fetched one when it holds the named sets), else fetch them."""
    env = os.environ.get("R3RAG_DATA")
    if env and Path(env).expanduser().is_dir() and not (Path(env).expanduser() / LOCK_NAME).is_file():
        return Path(env).expanduser()  # a local copy: used as it is
    m = load_manifest(manifest)
    root = fetch_root()
    if Lock.read(root).for_manifest(m).complete(m.resolve(names or [])):
        return root
    return fetch(names or [], root, manifest, console=console)


def _ask(m: Manifest, name: str, yes: bool, console, confirm) -> None:
    """A data set fetched only on request (wiki-18) states its size first, then needs a yes."""
    from r3rag.util.progress import say

    size = human(m.download_bytes(name))
    if confirm is None and not yes and sys.stdin.isatty():
        import typer

        confirm = lambda text: typer.confirm(text, default=False, err=True)  # noqa: E731
    if not yes and confirm is None:  # no one to ask: the error line states the size
        raise UserError(f"data fetch {name}: {size} to download (then unzipped); rerun with --yes to fetch it")
    say(console, f"data: {name}: {m.datasets[name]['about']}; {size} to download, then unzipped")
    if not yes and not confirm(f"Download {name} ({size})?"):
        raise UserError(f"data fetch {name}: not fetched")


def _hub_file(m: Manifest, lock: Lock, remote: Remote, path: str, root: Path, progress) -> None:
    """One hub file in `<root>/flashrag/`: re-checked if there, else downloaded; its hash recorded."""
    dest = root / "flashrag" / path
    pinned, learned = m.files[path].get("sha256"), lock.files.get(path, {}).get("sha256")
    if dest.is_file():
        sha = file_sha256(dest)
        if sha == (pinned or learned):
            lock.files.setdefault(path, {"sha256": sha, "size": dest.stat().st_size, "checked_by": "manifest sha256"})
            return
        if learned:  # this root checked it at this commit, and it changed since
            raise UserError(
                f"{dest}: sha256 {sha[:12]}... is not the {learned[:12]}... it had when fetched; "
                "refused (delete it to fetch it again)"
            )
        dest.unlink()  # from another commit, or never checked here: fetch it again
    sha, checked_by = download(remote, path, dest, pinned or learned, progress)
    lock.files[path] = {"sha256": sha, "size": dest.stat().st_size, "checked_by": checked_by}
    lock.write()  # at once: a later failure keeps what was learned


@contextmanager
def _exclusive(root: Path):
    """One fetch per data root at a time (flock: released when the process dies)."""
    with open(root / ".fetch.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{root}: another `r3rag data fetch` is writing it; wait for it to finish") from None
        yield


def _readme(m: Manifest, lock: Lock, root: Path) -> None:
    lines = [
        "# Real QA sets fetched by `r3rag data fetch`",
        "",
        f"From the Hugging Face hub: `{m.repo_id}` ({m.repo_type}) at commit `{m.revision}`; the hub files",
        "as downloaded are in `flashrag/`, their sha256 in `flashrag.lock.json`. Each file below is in",
        "r3rag's question schema (`id`, `question`, `golden_answers`, `metadata`) or a passage corpus",
        "(`id`, `title`, `text`). Its name is the one the offline shared copy uses for a file of the same",
        "role, so the pipelines read either; the questions are FlashRAG's, drawn by a fixed rank",
        "(the order of sha256(`<hub file>:<line>`)), not that copy's picks.",
        "",
        "| file | rows | made from |",
        "|---|---|---|",
    ]
    for name, entry in sorted(lock.datasets.items()):
        outputs = m.datasets.get(name, {}).get("outputs", {})
        for path, rows in entry["outputs"].items():
            lines.append(f"| `{path}` | {rows} | {_made_from(outputs.get(path, {}))} |")
    (root / "README.md").write_text("\n".join(lines) + "\n")


def _made_from(spec: dict) -> str:
    def sel(s: dict) -> str:
        take = s.get("take", "all")
        return f"`{s['from']}` " + ("(all)" if take == "all" else f"(ranks {take[0]}-{take[1] - 1})")

    if "from" in spec:
        return sel(spec)
    if "corpus_of" in spec:
        return "the paragraphs of " + " + ".join(sel(s) for s in spec["corpus_of"])
    if "unzip" in spec:
        return f"`{spec['unzip']}`, unzipped"
    if "sample_of" in spec:
        return f"{spec['count']} passages of `{spec['sample_of']}` (seeded)"
    return ""


def print_status(root: Path | None = None, manifest: Path | None = None) -> None:
    """`r3rag data list`: every data set, its download size and what this data root holds of it."""
    from r3rag.data.shared import shared_data

    m = load_manifest(manifest)
    root = Path(root or fetch_root()).expanduser()
    lock = Lock.read(root).for_manifest(m)
    reads = shared_data()
    print(f"data root: {root} (fetch writes here; the pipelines read {reads or 'nothing yet: run make data'})")
    print(f"hub: {m.repo_id} @ {m.revision}")
    for name, spec in m.datasets.items():
        files = m.files_of(name)
        have = sum((root / "flashrag" / p).is_file() for p in files)
        state = "fetched" if lock.complete([name]) else f"{have}/{len(files)} files" if have else "-"
        tag = " (on request)" if spec.get("on_request") else " (default)" if name in m.default else ""
        print(f"  {name:<16} {human(m.download_bytes(name)):>9}  {state:<10} {spec['about']}{tag}")
