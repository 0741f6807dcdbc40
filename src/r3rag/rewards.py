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
  took it past `max_completion_tokens`) is a format error in every component, as an invalid
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

Usage:
    scorer = RewardScorer({"em": 1.0, "format": 0.1}, RewardSettings(), protocol)
    rows = scorer.score(trajectories, examples)   # [{"em": 1.0, "f1": 1.0, ...}, ...]
    funcs, weights = trl_reward_funcs(scorer.weights)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from r3rag.env import Trajectory
from r3rag.errors import UserError
from r3rag.judge import JudgeSpec
from r3rag.metrics import cover_match, exact_match, f1_score, normalize_answer
from r3rag.protocol import Protocol

ALWAYS = ("em", "f1", "cover", "format")
COMPONENTS = (*ALWAYS, "search_r1_format", "judge", "relevance", "r3rag")
RELEVANCE = ("gold", "embedding", "judge")


@dataclass
class R3ragWeights:
    correct: str = "em"  # how "right" is decided: em, cover or judge
    right: float = 1.6
    wrong: float = 0.8
    no_answer: float = 0.9
    format_error: float = -0.9
    answer_right: float = 2.0


@dataclass
class SearchR1Format:
    structure: float = 0.2
    final: float = 0.1
    retrieval: float = 0.0


@dataclass
class RewardSettings:
    relevance: str = "gold"  # gold, embedding or judge
    encoder: str = ""  # embedding relevance encoder ("" = the packaged all-MiniLM-L6-v2)
    judge: JudgeSpec = field(default_factory=JudgeSpec)  # the LLM judge's endpoint (judge, relevance=judge)
    doc_chars: int = 512  # characters of each document the relevance judge / encoder sees (R3-RAG: 512)
    r3rag: R3ragWeights = field(default_factory=R3ragWeights)
    search_r1_format: SearchR1Format = field(default_factory=SearchR1Format)


# ---- the components: plain functions ---------------------------------------------------------

def exact_match_reward(traj: Trajectory, example: dict) -> float:
    return exact_match(traj.answer, example["golden_answers"])


def f1_reward(traj: Trajectory, example: dict) -> float:
    return f1_score(traj.answer, example["golden_answers"])


def cover_reward(traj: Trajectory, example: dict) -> float:
    return cover_match(traj.answer, example["golden_answers"])


FORMAT_ERRORS = ("invalid", "length")  # finish reasons scored as a malformed trajectory


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


def r3rag_reward(traj: Trajectory, rels: list[float], right: bool, w: R3ragWeights) -> float:
    """R = o + mean(s_t); see the module docstring."""
    if traj.finish_reason in FORMAT_ERRORS:
        steps, outcome = [*rels, w.format_error], 0.0
    elif traj.finish_reason == "answer":
        steps = [(w.right if right else w.wrong) * r for r in rels]
        outcome = w.answer_right if right else 0.0
    else:  # max_turns (or a generator error): no answer within the turn limit
        steps, outcome = [w.no_answer * r for r in rels], 0.0
    return outcome + (sum(steps) / len(steps) if steps else 0.0)


def gold_relevance(traj: Trajectory, example: dict) -> list[float]:
    """Per search step: 1 if it retrieved a gold supporting document that no earlier step had."""
    meta = example.get("metadata") or {}
    ids = set(meta.get("supporting_docs") or [])
    titles = {normalize_answer(t) for t in meta.get("supporting_titles") or []}
    if not ids and not titles:
        raise UserError(f"reward.relevance=gold: question {example.get('id')!r} has no metadata.supporting_docs "
                        "or supporting_titles (use reward.relevance=embedding or judge)")
    seen: set[str] = set()
    out = []
    for docs in traj.documents:
        new = {d["id"] for d in docs if d["id"] in ids or normalize_answer(d["title"]) in titles} - seen
        out.append(1.0 if new else 0.0)
        seen |= new
    return out


# ---- scoring a batch -------------------------------------------------------------------------

class RewardScorer:
    """Computes every component that is logged or weighted, for a batch of trajectories."""

    def __init__(self, weights: dict[str, float], settings: RewardSettings, protocol: Protocol):
        check_settings(weights, settings)
        self.weights = {k: float(v) for k, v in weights.items()}
        self.names = [*ALWAYS, *(k for k in self.weights if k not in ALWAYS)]
        self.settings, self.protocol = settings, protocol
        self._relevance = None
        self._client = None

    def score(self, trajs: list[Trajectory], examples: list[dict]) -> list[dict[str, float]]:
        needs_rel = "relevance" in self.names or "r3rag" in self.names
        rels = self.relevance()(trajs, examples) if needs_rel else [[] for _ in trajs]
        verdicts = self._verdicts(trajs, examples)
        rows = []
        for t, ex, rel, verdict in zip(trajs, examples, rels, verdicts):
            row = {"em": exact_match_reward(t, ex), "f1": f1_reward(t, ex), "cover": cover_reward(t, ex),
                   "format": format_reward(t, self.protocol)}
            if "judge" in self.names:
                row["judge"] = float(verdict)
            if "search_r1_format" in self.names:
                row["search_r1_format"] = search_r1_format_reward(t, ex, bool(row["format"]),
                                                                  self.settings.search_r1_format)
            if "relevance" in self.names:
                row["relevance"] = sum(rel) / len(rel) if rel else 0.0
            if "r3rag" in self.names:
                right = {"em": row["em"], "cover": row["cover"], "judge": verdict}[self.settings.r3rag.correct]
                row["r3rag"] = r3rag_reward(t, rel, bool(right), self.settings.r3rag)
            rows.append(row)
        return rows

    def relevance(self):
        if self._relevance is None:
            from r3rag.relevance import make_relevance

            self._relevance = make_relevance(self.settings, self.client)
        return self._relevance

    def client(self):
        """One chat client (connections, concurrency) for the answer and the relevance judge."""
        if self._client is None:
            from r3rag.llm.openai_client import ChatClient

            spec = self.settings.judge
            if not spec.endpoint or not spec.model:
                raise UserError("rl.reward.judge: set endpoint and model (an OpenAI-compatible server) "
                                "for the judge reward or relevance=judge")
            self._client = ChatClient(spec.endpoint, spec.model, api_key_env=spec.api_key_env,
                                      concurrency=spec.concurrency)
        return self._client

    def _verdicts(self, trajs: list[Trajectory], examples: list[dict]) -> list[float]:
        """Outcome per trajectory by string match, then the LLM judge (only when a component needs it)."""
        wanted = "judge" in self.names or "r3rag" in self.names and self.settings.r3rag.correct == "judge"
        out = [exact_match_reward(t, ex) for t, ex in zip(trajs, examples)]
        if not wanted:
            return out
        from r3rag.judge import AnswerJudge

        verdicts = AnswerJudge(self.client()).judge_many(  # string match first, then the LLM
            [(t.question, ex["golden_answers"], t.answer) for t, ex in zip(trajs, examples)])
        return [float(v) for v in verdicts]


def check_settings(weights: dict, settings: RewardSettings) -> None:
    for name, w in weights.items():
        if name not in COMPONENTS:
            raise UserError(f"rl.rewards: unknown reward {name!r} (available: {', '.join(COMPONENTS)})")
        if not isinstance(w, (int, float)) or isinstance(w, bool):
            raise UserError(f"rl.rewards.{name}: expected a number, got {w!r}")
    if settings.relevance not in RELEVANCE:
        raise UserError(f"rl.reward.relevance: expected one of {', '.join(RELEVANCE)}, got {settings.relevance!r}")
    if settings.r3rag.correct not in ("em", "cover", "judge"):
        raise UserError(f"rl.reward.r3rag.correct: expected em, cover or judge, got {settings.r3rag.correct!r}")


def trl_reward_funcs(scorer: RewardScorer):
    """One TRL reward function per component, reading the scores the rollout computed.

    TRL gathers them across processes, logs `rewards/<name>/mean` and sums them with the
    weights (names not in the weights get weight 0: logged only). The first function also
    logs the rollout statistics through TRL's `log_metric` hook."""
    funcs, weights = [], []
    for i, name in enumerate(scorer.names):
        def reward(prompts, completions, scores, log_metric=None, _name=name, _first=i == 0, **kw):
            if _first and log_metric is not None:
                for key, value in rollout_stats(kw).items():
                    log_metric(key, value)
            return [s[_name] for s in scores]

        reward.__name__ = name
        funcs.append(reward)
        weights.append(scorer.weights.get(name, 0.0))
    return funcs, weights


def rollout_stats(fields: dict) -> dict[str, float]:
    """Searches per trajectory and finish-reason fractions over this process's rollouts."""
    reasons = fields.get("finish_reason") or []
    n = max(len(reasons), 1)
    out = {"rollout/searches": sum(fields.get("num_searches") or [0]) / n}
    for r in ("answer", "max_turns", "length", "invalid"):
        out[f"rollout/finish_{r}"] = sum(x == r for x in reasons) / n
    for key, value in (fields.get("timing") or [{}])[0].items():
        out[f"time/{key}"] = value
    return out
