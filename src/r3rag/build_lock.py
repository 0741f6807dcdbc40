"""One process builds an artifact at a time: an advisory lock file per artifact id.

Two r3rag commands on one runs directory (the workers of `r3rag run --jobs N`, or a second
terminal) may reach the same artifact. The first takes `runs/<stage>/.lock-<id>` (flock) before
any of the stage's work and holds it until the stage returns; the other either waits and then
reuses what the first published (a plain command), or is told the artifact is busy and builds
something else meanwhile (a `--jobs` worker). Without it, the second would delete the first's
checkpoints (`resume=false`) or train the same thing twice. The kernel drops a lock when its
process dies, so a killed run holds none (its empty file stays until the next holder removes
it). flock holds between the processes of one machine, not between NFS clients: the workers of
one runs directory run on one machine.

Usage:
    lock = BuildLock(final)                  # final: runs/<stage>/<id>
    if not lock.acquire(wait=False):
        raise ArtifactBusy(final)
    ...                                      # build, publish
    lock.release()
    BuildLock(final).held_elsewhere()        # `r3rag run --status`: is someone building it now?
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class ArtifactBusy(Exception):
    """Another process holds the artifact's build lock (raised only where the caller said not to wait)."""

    def __init__(self, final: Path):
        super().__init__(f"{final.parent.name}: {final.name} is being built by another process")
        self.final = final


def lock_file(final: Path) -> Path:
    """`.lock-<id>` beside the artifact's final folder (runs/<stage>/<id>)."""
    return final.parent / f".lock-{final.name}"


class BuildLock:
    def __init__(self, final: Path):
        self.path = lock_file(final)
        self._fd: int | None = None

    def acquire(self, wait: bool) -> bool:
        """Take the lock; False (wait=False) when another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if _same_file(fd, self.path):
                self._fd = fd
                return True
            os.close(fd)  # its holder removed the file on release: lock the one now at the path

    def release(self) -> None:
        """Drop the lock and remove the file (no lock files left in the runs dir). A process that
        opened the removed file meanwhile sees that on locking it, and locks the new one."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (for status; takes and drops it if free)."""
        if not self.path.exists():
            return False
        if not self.acquire(wait=False):
            return True
        self.release()
        return False


def _same_file(fd: int, path: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
