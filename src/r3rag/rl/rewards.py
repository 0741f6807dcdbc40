"""Rewards: plain functions of a finished trajectory and its example, combined with weights.

Every component is computed for every trajectory and logged per step; a component with
weight 0 is a metric only. `em`, `f1`, `cover` and `format` are always logged; the others
are computed when named in the weights. A reward that cannot be computed (a judge endpoint
down after its retries, gold relevance on data without gold documents) raises; it is never
silently scored 0.

Components (values in [0, 1] unless said):

- `em`, `f1`, `cover`: the parsed answer against the gold answers (SQuAD normalisation;
  cover = a gold answer occurs inside the prediction); 0 without an answer.
- `judge`: 1 if the answer string-matches a gold answer, else the LLM judge's verdict
  (R3-RAG's `check_correctness` order).
- `format`: 1 if well formed: every model turn is one closed action, `<think>` balanced,
  no `<information>` written by the model, and the last turn answers. A trajectory cut by a
  length limit (`finish_reason` "length": a turn ran out of `max_new_tokens`, or the documents
  took it past `max_completion_tokens`; "context": its next turn would pass `max_context_tokens`)
  is a format error in every component, as an invalid
  one is: running out of budget must not score better than writing a malformed turn.
- `search_r1_format`: Search-R1 v0.3's graded outcome+format reward, with s = structure
  (0.2), f = final (0.1), r = retrieval (0.0), valid = `format`, correct = EM:
  correct & valid 1; correct & invalid 1 - s; wrong (or no answer) & valid s (+ r when a
  gold answer appears in a retrieved document); wrong & invalid f; no answer & invalid 0.
- `relevance`: the mean relevance rel_t in [0, 1] of the documents each search step
  retrieved (0 without searches), judged by `reward.relevance`: `gold` (1 if the step
  retrieved a gold supporting document no earlier step had, else 0), `embedding`
  (max over the step's documents of the cosine between question and document, clipped
  at 0) or `judge` (the LLM judge's score for question, step and documents).
- `r3rag`: R3-RAG's process reward folded into one scalar per trajectory for GRPO.
  With rel_t for the T search steps and "right" decided by `reward.r3rag.correct`:

      s_t = 1.6 rel_t   if the trajectory answered and the answer is right
      s_t = 0.8 rel_t   if it answered wrong
      s_t = 0.9 rel_t   if it ended without an answer at the turn limit (max_turns)
      format error (a malformed turn k, which ends the trajectory, or a length limit):
      s_t = rel_t for the searches before it, plus one more step s_k = -0.9
      o   = 2.0 if answered and right, else 0
      R   = o + mean(s_t)          (the mean over the steps above; 0 when there are none)

  The constants are R3-RAG's per-step PPO rewards (`reward.r3rag.*`); R3-RAG gives each
  step its own sample, GRPO needs one number per trajectory, hence the mean.

Per-step credit (`RewardScorer(..., step_credit=True)`, `rl.process_credit=step`): the
process components (`relevance`, `r3rag`) are not folded into the trajectory number. Each
trajectory instead gets its per-step process rewards, keyed by the model turn they belong to
(`score_steps`): x_k = w_relevance rel_t + w_r3rag s_t on the turn that wrote search t, and
R3-RAG's format-error step s_k on the last model turn. The trajectory reward TRL normalises
keeps the other components, plus `r3rag_outcome` (o above, weighted like `r3rag`); `relevance`
and `r3rag` are still computed and logged, at weight 0. `grpo` turns the x_k into per-token
advantages (see `trainers.step_advantages`).

Usage:
    scorer = RewardScorer({"em": 1.0, "format": 0.1}, RewardSettings(), protocol)
    rows = scorer.score(trajectories, examples)   # [{"em": 1.0, "f1": 1.0, ...}, ...]
    rows, steps = scorer.score_steps(trajectories, examples)   # steps: [[turn index, x_k], ...] per trajectory
    funcs, weights = trl_reward_funcs(scorer)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from r3rag.core.env import Trajectory
from r3rag.core.metrics import cover_match, exact_match, f1_score, normalize_answer
from r3rag.core.protocol import Protocol
from r3rag.evaluation.judge import JudgeSpec
from r3rag.util.config import check_literals
from r3rag.util.errors import UserError

ALWAYS = ("em", "f1", "cover", "format")
COMPONENTS = (*ALWAYS, "search_r1_format", "judge", "relevance", "r3rag")
PROCESS = ("relevance", "r3rag")  # the components with a per-step form (step credit)
Relevance = Literal["gold", "embedding", "judge"]


@dataclass
class R3ragWeights:
    correct: Literal["em", "cover", "judge"] = "em"  # how "right" is decided
    right: float = 1.6  # s_t = right x rel_t when the answer is right
    wrong: float = 0.8  # s_t = wrong x rel_t when the answer is wrong
    no_answer: float = 0.9  # s_t = no_answer x rel_t when max_turns ended it without an answer
    format_error: float = -0.9  # the extra step s_k after a malformed turn or a length limit
    answer_right: float = 2.0  # the outcome o of a right answer (0 otherwise)

    def __post_init__(self):
        check_literals(self, "reward.r3rag")


@dataclass
class SearchR1Format:
    structure: float = 0.2  # s: what a well-formed wrong answer earns, and a malformed right one loses
    final: float = 0.1  # f: what a malformed wrong answer earns
    retrieval: float = 0.0  # r: added to s when a gold answer appears in a retrieved document


@dataclass
class RewardSettings:
    # How a search step's documents are judged (r3rag.rl.relevance): embedding (the default: any corpus),
    # judge, or gold, an ORACLE process reward that reads the gold documents no real corpus offers.
    relevance: Relevance = "embedding"
    encoder: str = ""  # embedding relevance encoder ("" = the packaged all-MiniLM-L6-v2)
    judge: JudgeSpec = field(default_factory=JudgeSpec)  # the LLM judge's endpoint (judge, relevance=judge)
    doc_chars: int = 512  # characters of each document the relevance judge / encoder sees (R3-RAG: 512)
    r3rag: R3ragWeights = field(default_factory=R3ragWeights)  # the `r3rag` component's constants
    search_r1_format: SearchR1Format = field(default_factory=SearchR1Format)  # the `search_r1_format` constants

    def __post_init__(self):
        check_literals(self, "reward")  # settings built in code skip the config's check


# ---- the components: plain functions ---------------------------------------------------------


def exact_match_reward(traj: Trajectory, example: dict) -> float:
    return exact_match(traj.answer, example["golden_answers"])


def f1_reward(traj: Trajectory, example: dict) -> float:
    return f1_score(traj.answer, example["golden_answers"])


def cover_reward(traj: Trajectory, example: dict) -> float:
    return cover_match(traj.answer, example["golden_answers"])


FORMAT_ERRORS = ("invalid", "length", "context")  # finish reasons scored as a malformed trajectory


def format_reward(traj: Trajectory, protocol: Protocol) -> float:
    if traj.finish_reason in FORMAT_ERRORS:  # by its finish reason, whatever its turns parse to
        return 0.0
    texts = [t.text for t in traj.turns if t.role == "model"]
    return float(protocol.is_well_formed(texts))


def gold_in_documents(traj: Trajectory, golds: list[str]) -> bool:
    """Search-R1's `is_retrieval_correct`: a normalised gold answer inside a retrieved document."""
    texts = [f" {normalize_answer(d['title'] + ' ' + d['text'])} " for docs in traj.documents for d in docs]
    return any(f" {normalize_answer(g)} " in t for g in golds if normalize_answer(g) for t in texts)


def search_r1_format_reward(traj: Trajectory, example: dict, valid: bool, w: SearchR1Format) -> float:
    if traj.answer is not None and exact_match(traj.answer, example["golden_answers"]):
        return 1.0 if valid else 1.0 - w.structure
    if valid:
        return w.structure + (w.retrieval if gold_in_documents(traj, example["golden_answers"]) else 0.0)
    return w.final if traj.answer is not None else 0.0


def r3rag_steps(traj: Trajectory, rels: list[float], right: bool, w: R3ragWeights) -> tuple[list[float], float]:
    """R3-RAG's step rewards s_t (one per search with documents, then the format-error step if
    any) and its outcome o; see the module docstring."""
    if traj.finish_reason in FORMAT_ERRORS:
        return [*rels, w.format_error], 0.0
    if traj.finish_reason == "answer":
        return [(w.right if right else w.wrong) * r for r in rels], (w.answer_right if right else 0.0)
    return [w.no_answer * r for r in rels], 0.0  # max_turns (or a generator error): no answer in the turn limit


def r3rag_reward(traj: Trajectory, rels: list[float], right: bool, w: R3ragWeights) -> float:
    """R = o + mean(s_t); see the module docstring."""
    steps, outcome = r3rag_steps(traj, rels, right, w)
    return outcome + (sum(steps) / len(steps) if steps else 0.0)


def search_turns(traj: Trajectory) -> list[int]:
    """Indices in `traj.turns` of the model turns that searched (model turns and steps pair up in order)."""
    model = [i for i, t in enumerate(traj.turns) if t.role == "model"]
    return [i for i, s in zip(model, traj.steps) if s["kind"] == "search"]


# ---- scoring a batch -------------------------------------------------------------------------


class RewardScorer:
    """Computes every component that is logged or weighted, for a batch of trajectories.
    `step_credit`: the process components go per step, not into the trajectory reward (module docstring)."""

    def __init__(
        self, weights: dict[str, float], settings: RewardSettings, protocol: Protocol, step_credit: bool = False
    ):
        check_weights(weights)
        self.weights = {k: float(v) for k, v in weights.items()}
        self.step_credit = step_credit
        if step_credit:
            check_step_credit(self.weights)
        outcome = ["r3rag_outcome"] if step_credit and self.weights.get("r3rag") else []
        self.names = [*ALWAYS, *(k for k in self.weights if k not in ALWAYS), *outcome]
        self.settings, self.protocol = settings, protocol
        self._relevance = None
        self._client = None

    def trl_weights(self) -> dict[str, float]:
        """The weight TRL gives each name: with step credit, the process components are logged
        only (their steps are credited per token) and `r3rag_outcome` takes r3rag's weight."""
        out = {n: self.weights.get(n, 0.0) for n in self.names}
        if self.step_credit:
            out.update({n: 0.0 for n in PROCESS if n in out})
            if "r3rag_outcome" in out:
                out["r3rag_outcome"] = self.weights["r3rag"]
        return out

    def process_weight(self) -> float:
        """W: the summed weights of the process components (what the step advantages are scaled by)."""
        return sum(self.weights.get(n, 0.0) for n in PROCESS)

    def trajectory_reward(self, row: dict[str, float]) -> float:
        """The weighted sum TRL computes from a row (before it normalises within the group)."""
        return sum(w * row[n] for n, w in self.trl_weights().items() if w)

    def score(self, trajs: list[Trajectory], examples: list[dict]) -> list[dict[str, float]]:
        return self.score_steps(trajs, examples)[0]

    def score_steps(self, trajs: list[Trajectory], examples: list[dict]) -> tuple[list[dict], list[list]]:
        """(rows, steps): a row of component values per trajectory, and with step credit its
        weighted per-step process rewards as [turn index, x_k] pairs (else empty lists)."""
        needs_rel = "relevance" in self.names or "r3rag" in self.names
        rels = self.relevance()(trajs, examples) if needs_rel else [[] for _ in trajs]
        verdicts = self._verdicts(trajs, examples)
        rows, steps = [], []
        for t, ex, rel, verdict in zip(trajs, examples, rels, verdicts):
            row = {
                "em": exact_match_reward(t, ex),
                "f1": f1_reward(t, ex),
                "cover": cover_reward(t, ex),
                "format": format_reward(t, self.protocol),
            }
            right = {"em": row["em"], "cover": row["cover"], "judge": verdict}[self.settings.r3rag.correct]
            if "judge" in self.names:
                row["judge"] = float(verdict)
            if "search_r1_format" in self.names:
                row["search_r1_format"] = search_r1_format_reward(
                    t, ex, bool(row["format"]), self.settings.search_r1_format
                )
            if "relevance" in self.names:
                row["relevance"] = sum(rel) / len(rel) if rel else 0.0
            if "r3rag" in self.names:
                row["r3rag"] = r3rag_reward(t, rel, bool(right), self.settings.r3rag)
            if "r3rag_outcome" in self.names:
                row["r3rag_outcome"] = r3rag_steps(t, rel, bool(right), self.settings.r3rag)[1]
            rows.append(row)
            steps.append(self._process_steps(t, rel, bool(right)) if self.step_credit else [])
        return rows, steps

    def _process_steps(self, t: Trajectory, rel: list[float], right: bool) -> list[list]:
        """[turn index, x_k] for each model turn that earns a process reward."""
        turns = search_turns(t)
        if len(rel) > len(turns):  # e.g. IRCoT: the env searched the question before any model turn
            raise UserError(
                f"rl.process_credit=step: trajectory {t.id!r} has {len(rel)} retrievals but "
                f"{len(turns)} search turns (this protocol retrieves without a model turn)"
            )
        x: dict[int, float] = {}
        w_rel, w_r3 = self.weights.get("relevance", 0.0), self.weights.get("r3rag", 0.0)
        if w_rel:
            for i, r in zip(turns, rel):
                x[i] = x.get(i, 0.0) + w_rel * r
        if w_r3:
            values, _ = r3rag_steps(t, rel, right, self.settings.r3rag)
            model = [i for i, turn in enumerate(t.turns) if turn.role == "model"]
            owners = turns[: len(rel)] + model[-1:] * (len(values) - len(rel))  # the format error: the last turn
            for i, v in zip(owners, values):
                x[i] = x.get(i, 0.0) + w_r3 * v
        return [[i, v] for i, v in sorted(x.items())]

    def relevance(self):
        if self._relevance is None:
            from r3rag.rl.relevance import make_relevance

            self._relevance = make_relevance(self.settings, self.client)
        return self._relevance

    def client(self):
        """One chat client (connections, concurrency) for the answer and the relevance judge."""
        if self._client is None:
            spec = self.settings.judge
            purpose = "for the judge reward or relevance=judge"
            self._client = spec.client("rl.reward.judge", purpose, concurrency=spec.concurrency)
        return self._client

    def _verdicts(self, trajs: list[Trajectory], examples: list[dict]) -> list[float]:
        """Outcome per trajectory by string match, then the LLM judge (only when a component needs it)."""
        wanted = "judge" in self.names or "r3rag" in self.names and self.settings.r3rag.correct == "judge"
        out = [exact_match_reward(t, ex) for t, ex in zip(trajs, examples)]
        if not wanted:
            return out
        from r3rag.evaluation.judge import AnswerJudge

        verdicts = AnswerJudge(self.client()).judge_many(  # string match first, then the LLM
            [(t.question, ex["golden_answers"], t.answer) for t, ex in zip(trajs, examples)]
        )
        return [float(v) for v in verdicts]


def check_weights(weights: dict) -> None:
    for name, w in weights.items():
        if name not in COMPONENTS:
            raise UserError(f"rl.rewards: unknown reward {name!r} (available: {', '.join(COMPONENTS)})")
        if not isinstance(w, (int, float)) or isinstance(w, bool):
            raise UserError(f"rl.rewards.{name}: expected a number, got {w!r}")


def check_step_credit(weights: dict[str, float]) -> None:
    if any(weights.get(n, 0.0) < 0 for n in PROCESS) or not sum(weights.get(n, 0.0) for n in PROCESS) > 0:
        raise UserError(
            "rl.process_credit=step: give relevance or r3rag a positive weight in rl.rewards "
            "(their per-step rewards are what is credited per step)"
        )


def group_has_signal(scorer: RewardScorer, rows: list[dict], steps: list[list]) -> bool:
    """Whether a group of one prompt's rollouts gives any advantage: their trajectory rewards
    differ, or (step credit) their per-step process rewards do. A group without it only dilutes
    the batch (DAPO's dynamic sampling drops it)."""
    rewards = {round(scorer.trajectory_reward(r), 9) for r in rows}
    step_values = {round(v, 9) for s in steps for _, v in s}
    return len(rewards) > 1 or len(step_values) > 1


def trl_reward_funcs(scorer: RewardScorer):
    """One TRL reward function per component, reading the scores the rollout computed.

    TRL gathers them across processes, logs `rewards/<name>/mean` and sums them with the
    weights (`RewardScorer.trl_weights`: names not in the weights, and with step credit the
    process components, get weight 0: logged only). The first function also logs the rollout
    statistics through TRL's `log_metric` hook."""
    funcs = []
    for i, name in enumerate(scorer.names):

        def reward(prompts, completions, scores, log_metric=None, _name=name, _first=i == 0, **kw):
            if _first and log_metric is not None:
                for key, value in rollout_stats(kw).items():
                    log_metric(key, value)
            return [s[_name] for s in scores]

        reward.__name__ = name
        funcs.append(reward)
    return funcs, list(scorer.trl_weights().values())


def rollout_stats(fields: dict) -> dict[str, float]:
    """Searches per trajectory and finish-reason fractions over this process's rollouts."""
    reasons = fields.get("finish_reason") or []
    n = max(len(reasons), 1)
    out = {"rollout/searches": sum(fields.get("num_searches") or [0]) / n}
    for r in ("answer", "max_turns", "length", "invalid"):
        out[f"rollout/finish_{r}"] = sum(x == r for x in reasons) / n
    if "context" in reasons:  # only where a context budget is set and was hit: other runs' lines as before
        out["rollout/finish_context"] = sum(x == "context" for x in reasons) / n
    for key, value in (fields.get("timing") or [{}])[0].items():
        out[f"time/{key}"] = value
    for key, value in (fields.get("sampling") or [{}])[0].items():  # dynamic sampling's counts
        out[f"rollout/{key}"] = value
    return out
