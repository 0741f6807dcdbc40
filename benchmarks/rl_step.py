"""Seconds per GRPO step of `r3rag rl` on CPU, and where they go.

Setup (in a temp runs dir, ~1 min): the default synthetic world, its BM25 index, oracle
trajectories, a short SFT of the demo's 4x128 model (so the policy searches). Then `r3rag rl`
runs 8 prompts x group 4 for a few steps; the stage's own per-step timings (metrics.jsonl:
time/step, time/generation, time/retrieval, time/optimizer) are averaged after a warm-up step.

Baseline, measured in the same run: TRL's GRPOTrainer with its built-in single-turn
generation (no environment, no retrieval) on the same model, prompts and group size, one
turn of the same token budget. The ratio says what the multi-turn environment costs.

PPO against GRPO, in the same run on the same cold start (`--algorithms`): each algorithm's
`r3rag rl` in a process of its own, so each peak RSS is its own; PPO's critic is one more model's
forward and backward per step (and its AdamW state).

LoRA against full fine-tuning (`--lora`): rollout tokens/s with the adapters merged while the
policy generates (r3rag.rl.grpo.generator), and unmerged as before, against full fine-tuning's.

    python benchmarks/rl_step.py [--steps 6] [--threads 2] [--algorithms | --lora]

The last line is JSON: seconds_per_step, share_generation, share_retrieval, share_optimizer
(+ share_reward, share_update = the rest: loss forward/backward and TRL's bookkeeping,
baseline_seconds_per_step, ratio_vs_single_turn); with --algorithms instead: grpo_step_s,
ppo_step_s, ppo_over_grpo, grpo_peak_rss_mb, ppo_peak_rss_mb; with --lora: full_gen_tokens_s,
lora_gen_tokens_s, lora_unmerged_gen_tokens_s, lora_over_full_generation,
lora_unmerged_over_full_generation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PROMPTS, GROUP = 8, 4


def prepare(runs: Path, threads: int):
    from r3rag.experiments.pipeline import run_stage

    run_stage("world", None, [], runs)
    run_stage("index", None, [], runs)
    run_stage("synthesize", None, ["limit=2000", "template=minimal", "doc_style=plain"], runs)
    return run_stage("sft", None, ["limit=2000", "epochs=1", "lr=1e-3", f"threads={threads}"], runs)


def multi_turn(runs: Path, steps: int, threads: int, *extra: str) -> dict:
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl

    ref = run_stage(
        "rl",
        None,
        [
            *extra,
            f"steps={steps}",
            f"prompts_per_step={PROMPTS}",
            f"num_generations={GROUP}",
            f"threads={threads}",
            "save_steps=0",
            "rollout_samples=0",
        ],
        runs,
    )
    rows = read_jsonl(ref.path / "metrics.jsonl")[1:]  # the first step warms up

    def mean(key):
        return statistics.mean(r[key] for r in rows)

    step = mean("time/step")
    return {
        "seconds_per_step": step,
        "generation": mean("time/generation"),
        "retrieval": mean("time/retrieval"),
        "optimizer": mean("time/optimizer"),
        "reward": mean("time/reward"),
        "searches": mean("rollout/searches"),
        "model_tokens": mean("completions/mean_length"),
    }


def single_turn(sft_path: Path, runs: Path, steps: int) -> float:
    """TRL's own GRPO step: one generate call per prompt, no environment."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from r3rag.core.protocol import Protocol
    from r3rag.training.helpers import device_flags, load_protocol_dict
    from r3rag.training.modeling import load_policy
    from r3rag.util.jsonl import read_jsonl

    model, tok = load_policy(sft_path)
    protocol = Protocol(**load_protocol_dict(sft_path))
    world = sorted((runs / "world").glob("*"))[-1]
    qs = read_jsonl(world / "train.jsonl")[: PROMPTS * (steps + 1)]
    ds = Dataset.from_dict({"prompt": [protocol.prompt(q["question"]) for q in qs]})
    args = GRPOConfig(
        output_dir=str(runs / "baseline"),
        max_steps=steps + 1,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=48,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        disable_tqdm=True,
        **device_flags("auto"),
    )
    times = []

    class Clock:  # wall time per step, as the rl stage measures it
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    from transformers import TrainerCallback

    clock = type("ClockCallback", (Clock, TrainerCallback), {})()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[clock],
    )
    trainer.train()
    return statistics.mean(times[1:])


ARMS = {  # name: the `r3rag rl` settings of that arm
    "grpo": ["algorithm=grpo"],
    "ppo": ["algorithm=ppo"],
    "full": [],
    "lora": ["lora=true"],
    "lora_unmerged": ["lora=true"],  # the same run with the adapters left unmerged while generating
}


def one_arm(runs: Path, arm: str, steps: int, threads: int) -> None:
    """Child process: one arm's `r3rag rl` on the prepared runs dir; prints its JSON line."""
    import resource

    if arm == "lora_unmerged":  # how LoRA rollouts ran before they merged the adapters (issue 49)
        from r3rag.rl import grpo

        grpo.merge_lora = lambda model: None
    m = multi_turn(runs, steps, threads, f"name=bench-{arm}", *ARMS[arm])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gen_tokens_s = m["model_tokens"] * PROMPTS * GROUP / m["generation"]  # model tokens generated per second
    row = {"step_s": m["seconds_per_step"], "peak_rss_mb": round(peak_mb, 1), "gen_tokens_s": gen_tokens_s}
    print(json.dumps(row))


def run_arms(runs: Path, arms: list[str], steps: int, threads: int) -> dict[str, dict]:
    """Each arm in a process of its own (its own peak RSS), one after the other, on the same cold start."""
    import subprocess

    rows = {}
    for arm in arms:
        cmd = [sys.executable, __file__, "--one", arm, str(runs), "--steps", str(steps), "--threads", str(threads)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows[arm] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def compare_algorithms(runs: Path, steps: int, threads: int) -> dict:
    rows = run_arms(runs, ["grpo", "ppo"], steps, threads)
    out = {}
    for arm, row in rows.items():
        out[f"{arm}_step_s"], out[f"{arm}_peak_rss_mb"] = round(row["step_s"], 3), row["peak_rss_mb"]
    out["ppo_over_grpo"] = round(out["ppo_step_s"] / out["grpo_step_s"], 3)
    print(
        f"PPO step {out['ppo_step_s']:.2f} s (peak {out['ppo_peak_rss_mb']:.0f} MB) vs GRPO "
        f"{out['grpo_step_s']:.2f} s ({out['grpo_peak_rss_mb']:.0f} MB): {out['ppo_over_grpo']:.2f}x",
        file=sys.stderr,
    )
    return out


def compare_lora(runs: Path, steps: int, threads: int) -> dict:
    """Rollout tokens/s of a LoRA policy (adapters merged while generating, and unmerged as before)
    against full fine-tuning's, the same cold start: `lora_over_full_generation` is LoRA's seconds
    per generated token over full fine-tuning's (goal <= 1.1)."""
    rows = run_arms(runs, ["full", "lora", "lora_unmerged"], steps, threads)
    tps = {arm: row["gen_tokens_s"] for arm, row in rows.items()}
    out = {f"{arm}_gen_tokens_s": round(v, 1) for arm, v in tps.items()}
    out["lora_over_full_generation"] = round(tps["full"] / tps["lora"], 3)
    out["lora_unmerged_over_full_generation"] = round(tps["full"] / tps["lora_unmerged"], 3)
    print(
        f"rollout tokens/s: full {tps['full']:.0f}, LoRA merged {tps['lora']:.0f}, unmerged "
        f"{tps['lora_unmerged']:.0f}: LoRA / full time per token {out['lora_over_full_generation']:.2f} "
        f"(unmerged {out['lora_unmerged_over_full_generation']:.2f})",
        file=sys.stderr,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--algorithms", action="store_true", help="PPO against GRPO instead of the step's shares")
    ap.add_argument("--lora", action="store_true", help="LoRA against full fine-tuning rollout tokens/s instead")
    ap.add_argument("--one", nargs=2, metavar=("ARM", "RUNS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    if a.one:
        return one_arm(Path(a.one[1]), a.one[0], a.steps, a.threads)
    if a.algorithms or a.lora:
        with tempfile.TemporaryDirectory() as tmp:
            prepare(Path(tmp), a.threads)
            compare = compare_algorithms if a.algorithms else compare_lora
            print(json.dumps(compare(Path(tmp), a.steps, a.threads)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        sft = prepare(runs, a.threads)
        m = multi_turn(runs, a.steps, a.threads)
        base = single_turn(sft.path, runs, a.steps)
    step = m["seconds_per_step"]
    shares = {k: m[k] / step for k in ("generation", "retrieval", "optimizer", "reward")}
    print(
        f"GRPO step, {PROMPTS} prompts x group {GROUP}, tiny model on CPU ({a.threads} threads): {step:.2f} s "
        f"(generation {shares['generation']:.0%}, retrieval {shares['retrieval']:.1%}, "
        f"optimizer.step {shares['optimizer']:.1%}, reward {shares['reward']:.1%}); "
        f"{m['searches']:.2f} searches and {m['model_tokens']:.0f} model tokens per trajectory",
        file=sys.stderr,
    )
    print(
        f"baseline: TRL single-turn GRPO step {base:.2f} s -> multi-turn / single-turn = {step / base:.2f}x",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "seconds_per_step": round(step, 3),
                "share_generation": round(shares["generation"], 4),
                "share_retrieval": round(shares["retrieval"], 4),
                "share_optimizer": round(shares["optimizer"], 4),
                "share_reward": round(shares["reward"], 4),
                "share_update": round(1 - sum(shares.values()), 4),
                "baseline_seconds_per_step": round(base, 3),
                "ratio_vs_single_turn": round(step / base, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
