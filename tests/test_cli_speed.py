"""`r3rag --help` stays fast: neither importing the CLI nor rendering any command's help imports a
heavy library. No timing here (benchmarks/cli_startup.py measures it); what makes help slow is an
import of torch or transformers at the top of a module the CLI reaches, and that is what fails."""

import json
import subprocess
import sys

# Seconds to import, each of them; none is needed to print help.
HEAVY = ("torch", "transformers", "trl", "datasets", "accelerate", "bm25s", "faiss", "numpy", "scipy", "fastapi")
# Typer's rich help formatter alone takes ~0.29 s to import (rich's console, markdown, tables): help is plain click,
# and rich waits for a command's own output.
HEAVY += ("rich",)


def loaded_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_imports_no_heavy_library():
    assert loaded_after("import r3rag.cli.app") == []


def test_every_commands_help_imports_no_heavy_library():
    code = """
from typer.testing import CliRunner
from r3rag.cli.app import app
names = [c.name for c in app.registered_commands]
assert len(names) >= 10, names
for args in [["--help"], *([n, "--help"] for n in names)]:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "Usage" in result.stdout, (args, result.stdout, result.exception)
"""
    assert loaded_after(code) == []


def test_the_probe_sees_a_heavy_import():
    """The check above can fail: the same probe reports a module that was imported."""
    assert loaded_after("import r3rag.cli.app, numpy") == ["numpy"]
