"""The R3-RAG attempt loop behind `r3rag synthesize`: teachers' attempts, their verdicts, and the
rows the stage writes.

Per question, up to `attempts` attempts (the first greedy, later ones sampled at `temperature`)
through the rollout environment; an attempt is accepted when `teachers.verify` passes (answered,
well formed, the answer matching a gold one by `match`, or an LLM judge's yes for one that does
not match) and, for the oracle, `teachers.verify_evidence`. Each question yields one row as soon
as it is accepted or out of attempts: `status` accepted (the trajectory, with the reasons of the
attempts before it) or rejected (every attempt and its reason). `keep: all` is rejection sampling
instead: every question gets all `attempts`, each sampled at `temperature`, and its row keeps every
distinct accepted trajectory (`samples`; `trajectory_rows` writes each as `<id>#<k>`). `summarize_rows`
sums the rows up for the manifest.

Usage:
    for row in attempt_loop(questions, teacher, retriever, protocol, AttemptSettings(top_k=5)):
        journal.append(row)
    metrics = summarize_rows(rows, n_extra=0, resumed=0, wall=12.3)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from r3rag.core.env import EnvSettings, run_rollouts
from r3rag.core.protocol import Protocol
from r3rag.synthesis import teachers
from r3rag.util.config import hashed_when_set

Reader = Literal["none", "closed-book", "rag", "gold"]
# The rollout mode each reader runs in: gold documents reach the prompt through rag mode, the
# gold retriever answering the question text (r3rag.data.gold).
READER_MODES = {"none": "iterative", "closed-book": "direct", "rag": "rag", "gold": "rag"}


@dataclass
class AttemptSettings(EnvSettings):  # top_k, max_turns, max_new_tokens: r3rag.core.env
    """What the attempt loop reads; `r3rag synthesize`'s Config extends it (the same keys)."""

    reader: Reader = "none"  # a reader baseline's data (template qa): closed-book, rag or gold
    max_new_tokens: int = 256  # per step (openai, hf): a teacher writes longer turns than a policy
    attempts: int = 3  # tries per question: until one is accepted (keep=first; the oracle: 1), or all (keep=all)
    temperature: float = 0.9  # attempts after the first (which is greedy)
    match: Literal["exact", "cover"] = "exact"  # how an answer must match a gold one
    # first: a question's first accepted attempt; all (rejection sampling): `attempts` attempts per question, all
    # sampled at `temperature` (none greedy), and every distinct accepted one becomes a trajectory `<id>#<k>`
    keep: Literal["first", "all"] = hashed_when_set("first")


def attempt_loop(batch: list[dict], teacher, retriever, protocol: Protocol, cfg: AttemptSettings, judge=None):
    """Yield one finished row per question, as soon as it is accepted or out of attempts."""
    # No trajectory budget of its own: room for every turn and its documents.
    env_cfg = cfg.env_config(READER_MODES[cfg.reader], max(1024, cfg.max_turns * (cfg.max_new_tokens + 512)))
    pending, history = list(batch), {q["id"]: [] for q in batch}
    if teacher.name == "oracle":  # nothing to follow: rejected without an attempt
        for q in [q for q in pending if teachers.gold_kind(q) is None]:
            yield _rejected(
                q,
                [
                    {
                        "attempt": 1,
                        "temperature": 0.0,
                        "reason": "no_gold_chain",
                        "tokens_in": 0,
                        "tokens_out": 0,
                        "trajectory": None,
                    }
                ],
            )
        pending = [q for q in pending if teachers.gold_kind(q) is not None]
    if cfg.keep == "all":
        yield from _sample_all(pending, teacher, retriever, protocol, cfg, judge, env_cfg)
        return
    n_attempts = 1 if teacher.deterministic else cfg.attempts
    for attempt in range(1, n_attempts + 1):
        if not pending:
            break
        temperature = 0.0 if attempt == 1 else cfg.temperature
        gen = teacher.generator(pending, temperature)
        trajs = run_rollouts(pending, gen, retriever, protocol, env_cfg, teacher.tokenizer)
        verdicts = _verdicts(trajs, pending, teacher, protocol, cfg, judge)
        still = []
        for traj, q, (ok, reason) in zip(trajs, pending, verdicts):
            tokens = teacher.usage(gen, traj)
            if ok:
                yield _accepted(traj, q, attempt, tokens, history[q["id"]])
            else:
                history[q["id"]].append(_attempt_record(attempt, temperature, reason, tokens, traj))
                still.append(q)
        pending = still
    for q in pending:
        yield _rejected(q, history[q["id"]])


def _sample_all(batch, teacher, retriever, protocol: Protocol, cfg: AttemptSettings, judge, env_cfg):
    """keep=all: every question gets `attempts` sampled attempts (rejection-sampling fine-tuning's group); its
    distinct accepted trajectories are kept (an exact repeat of one teaches nothing new), the others go to its
    history. One row per question, yielded once every attempt is in."""
    kept, history = {q["id"]: [] for q in batch}, {q["id"]: [] for q in batch}
    duplicates, spent = Counter(), {q["id"]: [0, 0] for q in batch}
    for attempt in range(1, cfg.attempts + 1):
        gen = teacher.generator(batch, cfg.temperature)
        trajs = run_rollouts(batch, gen, retriever, protocol, env_cfg, teacher.tokenizer)
        for traj, q, (ok, reason) in zip(trajs, batch, _verdicts(trajs, batch, teacher, protocol, cfg, judge)):
            tokens = teacher.usage(gen, traj)
            spent[q["id"]] = [spent[q["id"]][0] + tokens[0], spent[q["id"]][1] + tokens[1]]
            if not ok:
                history[q["id"]].append(_attempt_record(attempt, cfg.temperature, reason, tokens, traj))
            elif any(_same_turns(traj.to_json(), k) for k in kept[q["id"]]):
                duplicates[q["id"]] += 1
            else:
                kept[q["id"]].append({**traj.to_json(), "attempt": attempt})
    for q in batch:
        qid = q["id"]
        if not kept[qid]:
            yield _rejected(q, history[qid])
            continue
        yield {
            "id": qid,
            "question": q["question"],
            "golden_answers": q["golden_answers"],
            "metadata": _metadata(q),
            "status": "accepted",
            "attempt": kept[qid][0]["attempt"],  # the first accepted, as keep=first counts it
            "attempts_made": cfg.attempts,
            "tokens_in": spent[qid][0],
            "tokens_out": spent[qid][1],
            "rejected_attempts": [_attempt_summary(h) for h in history[qid]],
            "samples": kept[qid],
            "duplicates": duplicates[qid],
        }


def _same_turns(a: dict, b: dict) -> bool:
    return [(t["role"], t["text"]) for t in a["turns"]] == [(t["role"], t["text"]) for t in b["turns"]]


def _attempt_record(attempt: int, temperature: float, reason: str, tokens: tuple[int, int], traj) -> dict:
    return {
        "attempt": attempt,
        "temperature": temperature,
        "reason": reason,
        "tokens_in": tokens[0],
        "tokens_out": tokens[1],
        "trajectory": traj.to_json(),
    }


def _attempt_summary(h: dict) -> dict:
    """A rejected attempt as an accepted row lists it: why, and what it answered."""
    return {
        "attempt": h["attempt"],
        "reason": h["reason"],
        "answer": h["trajectory"]["answer"],
        "finish_reason": h["trajectory"]["finish_reason"],
    }


def _verdicts(trajs, questions, teacher, protocol: Protocol, cfg: AttemptSettings, judge) -> list[tuple[bool, str]]:
    verdicts = []
    for traj, q in zip(trajs, questions):
        ok, reason = teachers.verify(traj, q, protocol, cfg.match)
        if ok and teacher.name == "oracle":
            ok, reason = teachers.verify_evidence(traj, q)
        verdicts.append((ok, reason))
    if judge is not None:  # ask the judge only about answers that did not match
        asks = [i for i, (ok, reason) in enumerate(verdicts) if reason == "wrong_answer"]
        said = judge.judge_many(
            [(questions[i]["question"], questions[i]["golden_answers"], trajs[i].answer) for i in asks], strict=False
        )
        for i, verdict in zip(asks, said):
            verdicts[i] = (True, "ok") if verdict else (False, "judge_error" if verdict is None else "judge_wrong")
    return verdicts


def _accepted(traj, q: dict, attempt: int, tokens: tuple[int, int], history: list[dict]) -> dict:
    return {
        **traj.to_json(),
        "golden_answers": q["golden_answers"],
        "metadata": _metadata(q),
        "status": "accepted",
        "attempt": attempt,
        "tokens_in": tokens[0] + sum(h["tokens_in"] for h in history),
        "tokens_out": tokens[1] + sum(h["tokens_out"] for h in history),
        "rejected_attempts": [_attempt_summary(h) for h in history],
    }


def _rejected(q: dict, history: list[dict]) -> dict:
    return {
        "id": q["id"],
        "question": q["question"],
        "golden_answers": q["golden_answers"],
        "metadata": _metadata(q),
        "status": "rejected",
        "reject_reason": history[-1]["reason"],
        "tokens_in": sum(h["tokens_in"] for h in history),
        "tokens_out": sum(h["tokens_out"] for h in history),
        "attempts": history,
    }


def _metadata(q: dict) -> dict:
    # Context paragraphs are the corpus's business (and large); everything else is kept.
    return {k: v for k, v in (q.get("metadata") or {}).items() if k not in ("paragraphs", "context")}


def public_row(row: dict) -> dict:
    """A journal row as the artifact writes it (its status is which file it goes to)."""
    return {k: v for k, v in row.items() if k != "status"}


def trajectory_rows(row: dict) -> list[dict]:
    """The trajectories.jsonl rows of an accepted journal row: the row itself (keep=first), or one per kept
    sample (keep=all), id `<question id>#<k>` so ids stay unique, with the question's answers and metadata."""
    if "samples" not in row:
        return [public_row(row)]
    shared = {k: row[k] for k in ("golden_answers", "metadata", "source") if k in row}
    return [{**s, **shared, "id": f"{row['id']}#{k}", "question_id": row["id"]} for k, s in enumerate(row["samples"])]


def summarize_rows(rows: list[dict], n_extra: int, resumed: int, wall: float) -> dict:
    accepted = [r for r in rows if r["status"] == "accepted"]
    rejected = [r for r in rows if r["status"] == "rejected"]
    failed_attempts = [a["reason"] for r in rows for a in r.get("rejected_attempts", r.get("attempts", []))]
    attempts = [r.get("attempts_made", r["attempt"]) for r in accepted] + [len(r["attempts"]) for r in rejected]
    trajs = [t for r in accepted for t in trajectory_rows(r)]

    def mean(xs):
        return round(sum(xs) / len(xs), 3) if xs else 0.0

    return {
        "questions": len(rows),
        "accepted": len(accepted),
        "rejected": len(rejected),
        "acceptance_rate": round(len(accepted) / len(rows), 4),
        "rejected_by_reason": dict(Counter(r["reject_reason"] for r in rejected)),
        "rejected_attempts_by_reason": dict(Counter(failed_attempts)),
        "attempts": sum(attempts),
        "attempts_per_question": mean(attempts),
        "accepted_at_attempt": {str(k): v for k, v in sorted(Counter(r["attempt"] for r in accepted).items())},
        "steps_per_trajectory": mean([sum(t["role"] == "model" for t in r["turns"]) for r in trajs]),
        "searches_per_trajectory": mean([len(r["retrieved"]) for r in trajs]),
        "tokens_in": sum(r["tokens_in"] for r in rows),
        "tokens_out": sum(r["tokens_out"] for r in rows),
        "wall_seconds": round(wall, 2),
        "resumed_questions": resumed,
        "extra_worlds": n_extra,
        "from_eval_world": sum(r.get("source") == "world" for r in accepted),
        **_kept_stats(accepted, trajs),
    }


def _kept_stats(accepted: list[dict], trajs: list[dict]) -> dict:
    """keep=all's counts (nothing for keep=first, whose metrics stay as they were): trajectories kept,
    and accepted attempts dropped as exact repeats of a kept one."""
    if not any("samples" in r for r in accepted):
        return {}
    duplicates = sum(r.get("duplicates", 0) for r in accepted)
    return {
        "trajectories": len(trajs),
        "accepted_attempts": len(trajs) + duplicates,
        "duplicate_trajectories": duplicates,
    }
