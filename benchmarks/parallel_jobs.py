"""`r3rag run --jobs`: N worker processes of 1/N of the threads against one process with them all.

An experiment's variants are independent runs of small models (pipelines/replicate.yaml: a 4x128
Llama), whose generation and training leave cores idle between small matrix products. This
times the two stages that fill the replication, each as real `r3rag` commands: an eval (batched
greedy generation through the search loop) and an SFT (optimizer updates of 16 x 8 sequences).
Baseline: one command with every thread, once. Parallel: `--jobs` commands at once, each with
threads / jobs, the same work each. Throughput ratio = jobs x baseline seconds / parallel
seconds (the slowest of them), each from the artifacts' own `seconds`.

Without --policy it builds a small world, its teacher data and a tiny policy trained for a few
steps first (~3 min on 2 cores); with --policy (a runs/sft artifact) and --data (its teacher
data, a runs/synthesize artifact) it measures on those (the replication's cold start, say).
Run it on a quiet machine: anything else on the cores changes both arms.

    python benchmarks/parallel_jobs.py [--jobs 2] [--threads 2] [--questions 500] [--sft-steps 12]
    python benchmarks/parallel_jobs.py --policy runs/sft/replicate-... --data runs/synthesize/replicate-...

Last line: {"jobs_eval_throughput": ..., "jobs_sft_throughput": ..., "eval_s": [...], "sft_s": [...], ...}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

R3RAG = [sys.executable, "-m", "r3rag.cli"]
WORLD = ["seed=5", "paraphrases=3", "question_types=all", "named=0.25"]


def r3rag(*args: str) -> Path:
    """Run one r3rag command; the artifact path it prints last."""
    out = subprocess.run([*R3RAG, *args], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"r3rag {' '.join(args[:1])} failed: {out.stderr.strip().splitlines()[-1:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def prepare(runs: Path) -> tuple[Path, Path, Path, Path]:
    """world, index, teacher data and a tiny policy trained a few steps (its speed is what counts)."""
    world = r3rag("world", *sets(*WORLD), "--runs-dir", str(runs))
    index = r3rag("index", *sets(f"world={world}"), "--runs-dir", str(runs))
    data = r3rag("synthesize", *sets(f"world={world}", f"index={index}", "limit=2000"), "--runs-dir", str(runs))
    policy = r3rag(
        "sft", *sets(f"world={world}", f"data={data}", "max_steps=30", "save_steps=0"), "--runs-dir", str(runs)
    )
    return world, index, data, policy


def timed(commands: list[list[str]]) -> list[float]:
    """Run the commands at once; each artifact's own build seconds."""
    procs = [
        subprocess.Popen([*R3RAG, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    seconds = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode:
            sys.exit(f"r3rag failed: {err.strip().splitlines()[-1:]}")
        manifest = json.loads((Path(out.strip().splitlines()[-1]) / "manifest.json").read_text())
        seconds.append(manifest["seconds"])
    return seconds


def compare(stage: str, args: list[str], runs: Path, jobs: int, threads: int) -> tuple[float, float, list[float]]:
    """(throughput ratio, baseline seconds, parallel seconds); seeds keep every artifact distinct."""
    base = timed([[stage, *args, *sets(f"threads={threads}", "seed=100"), "--runs-dir", str(runs / "base")]])[0]
    each = max(1, threads // jobs)
    parallel = timed(
        [
            [stage, *args, *sets(f"threads={each}", f"seed={101 + i}"), "--runs-dir", str(runs / f"par{i}")]
            for i in range(jobs)
        ]
    )
    return round(jobs * base / max(parallel), 3), base, parallel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="the baseline's threads (the parallel arm splits them)")
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--sft-steps", type=int, default=12)
    ap.add_argument("--policy", type=Path, help="a runs/sft artifact (default: a tiny one built here)")
    ap.add_argument("--data", type=Path, help="its teacher data, a runs/synthesize artifact (with --policy)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        if a.policy:
            if not a.data:
                sys.exit("--policy needs --data (its teacher data: a runs/synthesize artifact)")
            manifest = json.loads((a.data / "manifest.json").read_text())
            world, index = manifest["inputs"]["world"]["path"], manifest["inputs"]["index"]["path"]
            data, policy = a.data, a.policy
        else:
            world, index, data, policy = prepare(runs / "prep")
        ev = sets(f"world={world}", f"index={index}", f"sft={policy}", "rl=", "systems=[sft]", f"limit={a.questions}")
        sft = sets(
            f"world={world}",
            f"data={data}",
            f"model={policy}/model",
            "limit=0",
            f"max_steps={a.sft_steps}",
            "batch_size=16",
            "grad_accum=8",
            "lr=1e-4",
            "save_steps=0",
        )
        eval_ratio, eval_base, eval_par = compare("eval", ev, runs / "eval", a.jobs, a.threads)
        sft_ratio, sft_base, sft_par = compare("sft", sft, runs / "sft", a.jobs, a.threads)
    print(
        json.dumps(
            {
                "jobs_eval_throughput": eval_ratio,
                "jobs_sft_throughput": sft_ratio,
                "eval_s": [eval_base, *eval_par],
                "sft_s": [sft_base, *sft_par],
                "jobs": a.jobs,
                "threads": a.threads,
                "questions": a.questions,
                "sft_steps": a.sft_steps,
            }
        )
    )


if __name__ == "__main__":
    main()
