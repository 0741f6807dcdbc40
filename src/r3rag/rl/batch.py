"""What GRPO's rollout function hands TRL, built from finished trajectories, and DAPO's dynamic
sampling over whole groups. Plain functions of trajectories and lists: no trainer, no model.

- `rollout_batch`: per trajectory `completion_ids`, `env_mask` (0 on retrieved tokens: no
  loss) ending in an EOS learned only where the model sampled it, `logprobs` (each sampled
  token's log-probability, None where unknown) and, for per-step credit, `step_credit` spans.
- `dynamic_sample`: groups whose rollouts all earn the same reward are set aside and refilled
  from fresh questions (`fresh_questions`), a bounded number of rounds.

Usage:
    batch = rollout_batch(trajs, tokenizer.eos_token_id, max_completion_tokens=512)
    (examples, trajs, scores, steps), counts = dynamic_sample(examples, 8, roll, draw, has_signal, 4)
"""

from __future__ import annotations

import random

from r3rag.core.env import Trajectory
from r3rag.training.helpers import completion_with_eos


def rollout_batch(
    trajs: list[Trajectory],
    eos_id: int,
    max_completion_tokens: int,
    mask_retrieved: bool = True,
    steps: list[list] | None = None,
    turns: bool = False,
    fold: bool = False,
) -> dict:
    """TRL's rollout dict: ids and env_mask from the one span rule shared with SFT, except the
    final EOS: learned only where the model sampled it (`eos_rule="sampled"`), never the one
    appended after a turn the env stopped at `</answer>`.
    `mask_retrieved=False` is Search-R1's ablation: retrieved tokens get loss like model tokens
    (the final EOS keeps its own rule).
    `steps` (per-step credit): each trajectory's [turn index, process reward] pairs
    (`RewardScorer.score_steps`), returned as `step_credit` token spans (`step_spans`).
    `turns` (ppo_unit=step): each model turn's token span, as `turn_spans` (`turn_spans`).
    `fold` (context: fold): TRL gets each trajectory's last model turn as its row (the context it
    was sampled from, then its tokens), and `fold_rows` every turn's row (r3rag.rl.fold_rows)."""
    if fold:
        from r3rag.rl.fold_rows import turn_rows

        rows = [turn_rows(t, eos_id) for t in trajs]
        last = [r[-1] for r in rows]
        return {
            "prompt_ids": [r["prompt_ids"] for r in last],
            "completion_ids": [r["completion_ids"] for r in last],
            "logprobs": [r["logprobs"] for r in last],
            "env_mask": [r["env_mask"] for r in last],
            "pred_answer": [t.answer for t in trajs],
            "finish_reason": [t.finish_reason for t in trajs],
            "num_searches": [len(t.retrieved) for t in trajs],
            "fold_rows": rows,
        }
    pairs = [completion_with_eos(t, eos_id, max_completion_tokens, eos_rule="sampled") for t in trajs]
    logprobs = [completion_logprobs(t, eos_id, len(ids)) for t, (ids, _) in zip(trajs, pairs)]
    if not mask_retrieved:
        pairs = [(ids, [1] * (len(mask) - 1) + mask[-1:]) for ids, mask in pairs]
    out = {
        "prompt_ids": [t.prompt_ids for t in trajs],
        "completion_ids": [p[0] for p in pairs],
        "logprobs": logprobs,
        "env_mask": [p[1] for p in pairs],
        "pred_answer": [t.answer for t in trajs],
        "finish_reason": [t.finish_reason for t in trajs],
        "num_searches": [len(t.retrieved) for t in trajs],
    }
    if steps is not None:
        out["step_credit"] = [step_spans(t, s, len(ids)) for t, s, (ids, _) in zip(trajs, steps, pairs)]
    if turns:
        out["turn_spans"] = [turn_spans(t, len(ids)) for t, (ids, _) in zip(trajs, pairs)]
    return out


def turn_spans(traj: Trajectory, n: int) -> list[list[int]]:
    """[start, end) of each model turn's tokens in the completion of `n` ids (cut at n)."""
    spans, pos = [], 0
    for t in traj.turns:
        size = len(t.ids or [])
        if t.role == "model" and pos < n:
            spans.append([pos, min(pos + size, n)])
        pos += size
    return spans


def step_spans(traj: Trajectory, steps: list[list], n: int) -> list[list]:
    """[start, end, x] for each [turn index, x] in `steps`: that turn's tokens in the completion
    of `n` ids, cut before its last one (the EOS, which keeps the trajectory's advantage)."""
    offsets, pos = [], 0
    for t in traj.turns:
        offsets.append(pos)
        pos += len(t.ids or [])
    spans = []
    for i, x in steps:
        start, end = offsets[i], min(offsets[i] + len(traj.turns[i].ids or []), n - 1)
        if start < end:
            spans.append([start, end, x])
    return spans


def dynamic_sample(examples: list[dict], group: int, roll, draw, has_signal, max_rounds: int) -> tuple[list, dict]:
    """DAPO's dynamic sampling over one process's share of a batch (whole groups of `group`).

    `roll(examples)` rolls out and scores, returning parallel lists (examples, trajectories,
    score rows, steps); `has_signal(part)` says whether one group's slice of them gives any
    advantage; `draw(k, round)` gives up to k fresh questions. Groups without signal are set
    aside and refilled from fresh questions, at most `max_rounds` times; slots still empty then
    take set-aside groups (zero advantage: they change nothing, but TRL needs the batch size).
    Returns the parallel lists for the batch and the counts that are logged."""
    need = len(examples) // group
    kept, flat, rounds, batch = [], [], 0, examples[::group]
    while True:
        cols = roll([e for e in batch for _ in range(group)])
        for g in range(0, len(cols[0]), group):
            part = tuple(c[g : g + group] for c in cols)
            (kept if has_signal(part) else flat).append(part)
        if len(kept) >= need or rounds == max_rounds:
            break
        batch = draw(need - len(kept), rounds + 1)
        if not batch:  # no fresh question left
            break
        rounds += 1
    final = kept[:need] + flat[: need - len(kept)]
    joined = [[x for part in final for x in part[c]] for c in range(len(cols))]
    stats = {"dropped_groups": len(flat), "refill_rounds": rounds, "flat_groups": max(0, need - len(kept))}
    return joined, stats


def fresh_questions(questions: list[dict], used: list[dict], seed: int, step: int, rank: int):
    """`draw(k, round)` for `dynamic_sample`: k questions not yet in this batch, drawn by a
    generator seeded by (seed, step, process, round), so a resumed run refills as a straight one."""
    tried = {q["id"] for q in used}

    def draw(k: int, round_no: int) -> list[dict]:
        fresh = [q for q in questions if q["id"] not in tried]
        picked = random.Random(f"{seed}:{step}:{rank}:{round_no}").sample(fresh, min(k, len(fresh)))
        tried.update(q["id"] for q in picked)
        return picked

    return draw


def completion_logprobs(traj: Trajectory, eos_id: int, n: int) -> list[float | None]:
    """The sampling logprob of each of the `n` ids `completion_with_eos` gives for `traj`, None
    where there is none (environment turns, a generator that did not record them). Its ids are the
    joined turns cut to `n - 1`, then EOS: that last one was sampled only if it is the EOS the
    generator kept (`eos_sampled`, ids ending in it, nothing cut). TRL reads None as NaN: no
    correction on that token (and masked tokens get no loss anyway)."""
    joined: list[float | None] = []
    for t in traj.turns:
        joined.extend(t.logprobs if t.role == "model" and t.logprobs is not None else [None] * len(t.ids or []))
    ids = [i for t in traj.turns for i in t.ids or []]
    kept_eos = traj.eos_sampled and len(ids) == n and ids[-1] == eos_id
    return joined[: n - 1] + [joined[-1] if kept_eos else None]


def check_whole_groups(prompts: list[str], group: int) -> None:
    if len(prompts) % group or any(p != prompts[i - i % group] for i, p in enumerate(prompts)):
        raise RuntimeError(
            f"dynamic sampling: this process got {len(prompts)} prompts that are not whole groups "
            f"of {group} (prompts_per_step x steps_per_generation must divide over the processes)"
        )
