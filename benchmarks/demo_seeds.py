"""`make demo` as a new user runs it, at world seeds 0-4: EM of every system, stage times, the CPU.

Clones the repository's HEAD into a scratch folder (nothing of this checkout's .venv or runs/),
runs `make demo` there for the first seed (the install included, as from a clean clone) and
`make demo SEED=s` for the others (the .venv then exists), each timed from outside. Writes
`results/demo-seeds.json` and the table between the `<!-- demo-seeds -->` markers of
docs/getting-started.md. Run it alone: the times are the point.

`--update` reruns only the seeds given and replaces their rows in the results file (a run that
shared its cores with other work); the first seed given is again run from a fresh clone.

Usage:
    python benchmarks/demo_seeds.py [--seeds 0,1,2,3,4] [--work /tmp/demo-seeds] [--keep]
    python benchmarks/demo_seeds.py --seeds 0 --update
Last line: {"demo_total_s_first": ..., "demo_total_s_max": ..., "sft_em_min": ..., "rl_minus_sft_min": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "getting-started.md"
RESULTS = REPO / "results" / "demo-seeds.json"
SYSTEMS = ("direct", "rag", "sft", "rl")
STAGES = ("world", "index", "synthesize", "sft", "rl", "eval")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    return "AVX-512" if "avx512f" in text else "AVX2" if "avx2" in text else "no AVX2"


def run_demo(clone: Path, seed: int) -> dict:
    t0 = time.time()
    proc = subprocess.run(["make", "demo", f"SEED={seed}"], cwd=clone, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode:
        raise SystemExit(f"make demo SEED={seed} failed:\n{proc.stderr[-3000:]}")
    eval_dir = Path(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((clone / eval_dir / "metrics.json").read_text())
    return {
        "seed": seed,
        "em": {s: metrics["systems"][s]["em"] for s in SYSTEMS},
        "seconds": {s: metrics["seconds"].get(s) for s in STAGES},
        "wall_s": round(wall, 1),
    }


def table(rows: list[dict], cpu: str) -> str:
    head = "| world seed | direct | rag | sft | rl | " + " | ".join(STAGES) + " | total wall |"
    lines = [head, "|" + "---|" * (6 + len(STAGES))]
    for r in rows:
        ems = " | ".join(f"{r['em'][s]:.3f}" for s in SYSTEMS)
        secs = " | ".join(f"{round(r['seconds'][s] or 0)} s" for s in STAGES)
        m, s = divmod(round(r["wall_s"]), 60)
        label = f"{r['seed']}" + (" (fresh clone, install included)" if r["first"] else "")
        lines.append(f"| {label} | {ems} | {secs} | {m} m {s:02d} s |")
    return (
        "\n".join(lines) + f"\n\nCPU: {cpu}, 2 cores, torch {torch_version()}; measured by `benchmarks/demo_seeds.py`."
    )


def torch_version() -> str:
    import torch

    return torch.__version__


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    pattern = re.compile(r"(<!-- demo-seeds -->\n).*?(\n<!-- /demo-seeds -->)", re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{DOC}: no <!-- demo-seeds --> ... <!-- /demo-seeds --> block")
    DOC.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--work", type=Path, default=Path("/tmp/demo-seeds"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch clone")
    ap.add_argument("--update", action="store_true", help="replace these seeds' rows in the results file")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(args.work)], check=True)
    rows = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        row = run_demo(args.work, seed)
        row["first"] = i == 0
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.update:
        done = {r["seed"] for r in rows}
        rows = sorted(
            rows + [r for r in json.loads(RESULTS.read_text())["runs"] if r["seed"] not in done],
            key=lambda r: r["seed"],
        )
    cpu = f"{cpu_model()} ({cpu_flags()})"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"cpu": cpu, "commit": commit.stdout.strip(), "runs": rows}, indent=2) + "\n")
    write_doc(table(rows, cpu))
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    sft = [r["em"]["sft"] for r in rows]
    print(
        json.dumps(
            {
                "demo_total_s_first": rows[0]["wall_s"],
                "demo_total_s_max": max(r["wall_s"] for r in rows),
                "sft_em_min": min(sft),
                "sft_em_mean": round(sum(sft) / len(sft), 4),
                "rl_minus_sft_min": round(min(r["em"]["rl"] - r["em"]["sft"] for r in rows), 4),
                "baseline_em_max": max(max(r["em"]["direct"], r["em"]["rag"]) for r in rows),
            }
        )
    )


if __name__ == "__main__":
    main()
