"""Headless Chromium for looking at our HTML: the DOM after scripts ran, or a screenshot.

Usage:
    if chromium_path(): dom = dump_dom(Path("viewer.html")); screenshot(Path("viewer.html"), Path("viewer.png"))
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from r3rag.util.errors import UserError

# No network here: without these flags Chromium keeps trying to reach Google's services.
_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    exe = chromium_path()
    if exe is None:
        raise UserError("chromium not found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [exe, *_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=timeout
        )


def dump_dom(html: Path, timeout: int = 60, fragment: str = "") -> str:
    """The page's DOM after its scripts ran; `fragment` is the URL's `#...` part (a page's state)."""
    uri = html.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    return _run(["--dump-dom", uri], timeout).stdout


def screenshot(html: Path, png: Path, width: int = 1280, height: int = 900, timeout: int = 60) -> Path:
    out = _run([f"--screenshot={png.resolve()}", f"--window-size={width},{height}", html.resolve().as_uri()], timeout)
    if not png.is_file():
        raise UserError(f"chromium did not write {png}: {out.stderr.strip().splitlines()[-1:] or ''}")
    return png
