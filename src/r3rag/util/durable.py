"""Making a written file survive a power cut: fsync it by path (a file, or a directory so that a
rename inside it is on disk too) before it is renamed into place or announced.

Usage:
    fsync_path(part); os.replace(part, final); fsync_path(final.parent)
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
