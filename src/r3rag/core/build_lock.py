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


# This process's locks, path -> [descriptor, holders]: flock excludes other processes, and a
# second writer for the same artifact in this one (a test, a library caller) must not wait on itself.
_HELD: dict[Path, list[int]] = {}


class BuildLock:
    def __init__(self, final: Path):
        self.path = lock_file(final)
        self._holding = False

    def acquire(self, wait: bool) -> bool:
        """Take the lock; False (wait=False) when another process holds it."""
        if self._holding:
            return True
        if self.path in _HELD:  # already this process's
            _HELD[self.path][1] += 1
            self._holding = True
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if _same_file(fd, self.path):
                _HELD[self.path] = [fd, 1]
                self._holding = True
                return True
            os.close(fd)  # its holder removed the file on release: lock the one now at the path

    def release(self) -> None:
        """Drop the lock (the last holder in this process removes the file: no lock files are
        left in the runs dir; a process that opened it meanwhile sees that and locks the new one)."""
        if not self._holding:
            return
        self._holding = False
        held = _HELD[self.path]
        held[1] -= 1
        if held[1] == 0:
            del _HELD[self.path]
            self.path.unlink(missing_ok=True)
            os.close(held[0])  # closing the descriptor drops the flock

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (for status; takes and drops it if free)."""
        if self.path in _HELD or not self.path.exists():
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
