"""Running the CLI in a subprocess and checking its one-line errors (shared by the CLI tests)."""

import subprocess
import sys


def r3rag(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "r3rag.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def assert_one_line_error(out, *needles):
    """Non-zero exit, exactly one stderr line starting with "error:", no traceback, naming each needle."""
    assert out.returncode != 0
    lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr
    for n in needles:
        assert n in lines[0], lines[0]
