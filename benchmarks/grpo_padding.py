"""GRPO's log-prob pass without padding waste: r3rag's length-sorted, trimmed groups vs TRL's
call on the whole padded batch, on real multi-turn rollouts.

TRL pads a generation batch to its longest prompt (left) and longest completion (right);
`ResumableGRPOTrainer._get_per_token_logps_and_entropies` sorts the rows by length, scores
them `LOGPS_ROWS` at a time with each group's all-padding columns trimmed (r3rag.training.trainers).
This rolls out `--prompts` x `--group` trajectories of a policy (a `runs/sft` artifact, or a
random tiny model steered to search: benchmarks/policy.py) at temperature 0.3, pads them as
TRL does, and times one loss-sized call (forward with entropy, backward) both ways on the
same batch, the median of `--reps`.

    python benchmarks/grpo_padding.py [--policy runs/sft/...] [--prompts 16] [--group 8] [--threads 2]

Last line: {"grpo_padding_speedup": ..., "padding_share": ..., "ours_s": ..., "trl_s": ..., "rows": ...}
(padding_share: the padded batch's share of columns that are padding).
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def padded_batch(questions, retriever, model, tok, protocol, source, group: int):
    """The trajectories' ids as TRL pads them: prompts on the left, completions on the right."""
    import torch
    from policy import steering  # benchmarks/policy.py

    from r3rag.core.env import EnvConfig, run_rollouts
    from r3rag.generation.hf import HFGenerator
    from r3rag.rl.grpo import rollout_batch

    gen = HFGenerator(model, tok, temperature=0.3, logits_processors=steering(source, tok))
    repeated = [q for q in questions for _ in range(group)]
    trajs = run_rollouts(repeated, gen, retriever, protocol, EnvConfig(max_new_tokens=48), tok)
    batch = rollout_batch(trajs, tok.eos_token_id, 512)
    prompts, completions = batch["prompt_ids"], batch["completion_ids"]
    p_w, c_w = max(map(len, prompts)), max(map(len, completions))
    pad = tok.pad_token_id
    ids = [[pad] * (p_w - len(p)) + p + c + [pad] * (c_w - len(c)) for p, c in zip(prompts, completions)]
    mask = [[0] * (p_w - len(p)) + [1] * (len(p) + len(c)) + [0] * (c_w - len(c)) for p, c in zip(prompts, completions)]
    return torch.tensor(ids), torch.tensor(mask), c_w


def trainer_for(model, tok, tmp: str):
    from datasets import Dataset
    from trl import GRPOConfig

    from r3rag.training.trainers import ResumableGRPOTrainer

    args = GRPOConfig(
        output_dir=tmp, use_cpu=True, bf16=False, report_to=[], temperature=0.3,
        per_device_train_batch_size=8, num_generations=8,
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": ["x"] * 8})
    return ResumableGRPOTrainer(
        model=model, args=args, processing_class=tok, train_dataset=data, reward_funcs=lambda completions, **_: [0.0]
    )


def seconds(call, model, ids, mask, keep: int, reps: int) -> float:
    times = []
    for _ in range(reps + 1):
        model.zero_grad()
        t0 = time.perf_counter()
        logps, _, _ = call(model, ids, mask, keep, compute_entropy=True)
        (logps * mask[:, -keep:]).sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first call warms up


def main() -> None:
    from policy import setup  # benchmarks/policy.py

    ap = argparse.ArgumentParser()
    ap.add_argument("--policy")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from trl import GRPOTrainer

    questions, retriever, model, tok, protocol, source = setup(args.policy, args.prompts, args.threads)
    ids, mask, keep = padded_batch(questions, retriever, model, tok, protocol, source, args.group)
    model.train()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(model, tok, tmp)

        def trl(*a, **kw):
            return GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **kw)

        theirs = seconds(trl, trainer.model, ids, mask, keep, args.reps)
        ours = seconds(trainer._get_per_token_logps_and_entropies, trainer.model, ids, mask, keep, args.reps)
    share = 1 - mask.float().mean().item()
    print(
        f"{len(ids)} rows padded to {ids.shape[1]} columns ({share:.0%} padding), policy: {source}; "
        f"log-probs forward+backward: TRL {theirs:.2f} s, r3rag {ours:.2f} s",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "grpo_padding_speedup": round(theirs / ours, 2),
                "padding_share": round(share, 3),
                "ours_s": round(ours, 3),
                "trl_s": round(theirs, 3),
                "rows": len(ids),
            }
        )
    )


if __name__ == "__main__":
    main()
