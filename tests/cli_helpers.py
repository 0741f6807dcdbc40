"""Running the CLI in a subprocess and checking its one-line errors (shared by the CLI tests)."""

import subprocess
import sys


def r3rag(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "r3rag.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def assert_one_line_error(out, *needles):
    """Non-zero exit, exactly one stderr line starting with "error:", no traceback, naming each needle."""
    assert out.returncode != 0
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert "Traceback" not in out.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def r3rag_inprocess(*args):
    """Run the CLI in this process (no interpreter start-up: for many small error cases). Returns a
    CompletedProcess-like object; an exception that escaped the CLI becomes a traceback on stderr."""
    import traceback

    from typer.testing import CliRunner

    from r3rag.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, stderr)
