"""How long `r3rag --help` and `r3rag <stage> --help` take, wall clock, each in a fresh interpreter.

Each command runs --repeats times (after one untimed run that warms the disk cache and writes
bytecode); the figures are medians of wall time and of CPU time (user + system, of the child
process). The target (issue 19) is <= 0.3 s wall for every one of them: help must not import
torch, transformers, TRL or datasets (tests/test_cli_speed.py checks that without timing
anything). On a machine other jobs keep busy the wall time grows with the load; the CPU time
much less, so it is the figure to compare between runs there. `typer_rich_floor_s` is what Typer's
rich help formatter would cost to import (rich, markdown-it, pygments): why r3rag prints plain click help.

Usage:
    python benchmarks/cli_startup.py [--repeats 5]
Last line: {"cli_help_s": ..., "stage_help_max_s": ..., "slowest": ..., "cli_help_cpu_s": ...,
            "stage_help_max_cpu_s": ..., "import_cli_s": ..., "typer_rich_floor_s": ..., "python_startup_s": ...}
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The r3rag script beside this interpreter, as a user runs it; `python -m r3rag.cli` where there is none.
SCRIPT = Path(sys.executable).with_name("r3rag")
CLI = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "r3rag.cli"]


def timed(cmd: list[str], repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of running `cmd`."""
    subprocess.run(cmd, capture_output=True, check=True)  # untimed: disk cache, .pyc files
    walls, cpus = [], []
    for _ in range(repeats):
        before = _children_cpu()
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        walls.append(time.perf_counter() - t0)
        cpus.append(_children_cpu() - before)
    return statistics.median(walls), statistics.median(cpus)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from r3rag.cli.app import app  # the command names, as the CLI registers them

    commands = [c.name for c in app.registered_commands]
    top = timed([*CLI, "--help"], args.repeats)
    per_command = {c: timed([*CLI, c, "--help"], args.repeats) for c in commands}
    bare = timed([sys.executable, "-c", "pass"], args.repeats)
    import_cli = timed([sys.executable, "-c", "import r3rag.cli.app"], args.repeats)
    floor = timed([sys.executable, "-c", "import typer.rich_utils"], args.repeats)
    for name, (w, c) in [("--help", top), *((f"{n} --help", t) for n, t in per_command.items())]:
        print(f"r3rag {name:<24} {w:6.3f} s wall {c:6.3f} s CPU")
    print(f"python -c pass {'':<15} {bare[0]:6.3f} s wall {bare[1]:6.3f} s CPU (the interpreter alone)")
    slowest = max(per_command, key=lambda n: per_command[n][0])
    result = {
        "cli_help_s": round(top[0], 3),
        "stage_help_max_s": round(per_command[slowest][0], 3),
        "slowest": slowest,
        "cli_help_cpu_s": round(top[1], 3),
        "stage_help_max_cpu_s": round(max(c for _, c in per_command.values()), 3),
        "import_cli_s": round(import_cli[0], 3),
        "typer_rich_floor_s": round(floor[0], 3),
        "python_startup_s": round(bare[0], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
