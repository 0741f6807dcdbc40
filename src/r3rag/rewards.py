"""Rewards: plain functions of a finished trajectory and its example, combined with weights.

A component with weight 0 is still computed and logged (a metric only). A reward that
cannot be computed raises; it is never silently scored 0.

Usage:
    exact_match_reward(traj_info, example) -> 1.0 / 0.0
    trl_reward_funcs({"em": 1.0, "format": 0.1}) -> (funcs, weights) for GRPOTrainer
"""

from __future__ import annotations

from r3rag.metrics import exact_match, f1_score


def exact_match_reward(answer: str | None, finish_reason: str, golden_answers: list[str]) -> float:
    return exact_match(answer, golden_answers)


def f1_reward(answer: str | None, finish_reason: str, golden_answers: list[str]) -> float:
    return f1_score(answer, golden_answers)


def format_reward(answer: str | None, finish_reason: str, golden_answers: list[str]) -> float:
    """1 when the trajectory ended with a parsed answer (every turn well formed), else 0."""
    return 1.0 if finish_reason == "answer" else 0.0


REWARDS = {"em": exact_match_reward, "f1": f1_reward, "format": format_reward}


def trl_reward_funcs(weights: dict[str, float]):
    """Wrap each named reward as a TRL reward function reading the rollout's extra fields."""
    from r3rag.errors import UserError

    funcs, ws = [], []
    for name, w in weights.items():
        if name not in REWARDS:
            raise UserError(f"rl.rewards: unknown reward {name!r} (available: {', '.join(REWARDS)})")
        fn = REWARDS[name]

        def reward(prompts, completions, golden_answers, pred_answer, finish_reason, _fn=fn, **kw):
            return [_fn(a, f, g) for a, f, g in zip(pred_answer, finish_reason, golden_answers)]

        reward.__name__ = name
        funcs.append(reward)
        ws.append(float(w))
    return funcs, ws
