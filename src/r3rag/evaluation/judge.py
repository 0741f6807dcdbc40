"""LLM-judged answer correctness over an OpenAI-compatible endpoint, as R3-RAG checks answers.

As R3-RAG's `check_correctness` and `cal_metric.py`: a normalised exact match against any gold
answer counts as correct without a call; otherwise one judgment at temperature 0, whose reply
must end with `Final answer: True` or `Final answer: False` ("uncertain" or anything else counts
as False). An empty prediction is False without a call. A request that still fails after the
client's retries raises `JudgeError` naming the endpoint: a judged score is never silently 0.
With `strict=False` (synthesis, where one question's failure must not stop the run) a failed
request gives None for that item instead.

Usage:
    judge = AnswerJudge(ChatClient(url, "Qwen2.5-72B-Instruct", concurrency=32))
    verdicts = judge.judge_many([(question, golden_answers, prediction), ...])   # [True, False, ...]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from r3rag.core.metrics import exact_match
from r3rag.generation.endpoint import EndpointSettings
from r3rag.util.errors import UserError

JUDGE_PROMPT = (
    "You are checking an answer to a question against the reference answers.\n"
    "Question: {question}\n"
    "Reference answers: {golds}\n"
    "Predicted answer: {prediction}\n"
    "Is the predicted answer correct, that is, does it mean the same as one of the reference answers? "
    "Explain briefly, then end with exactly one line: `Final answer: True` or `Final answer: False`."
)
_VERDICT = re.compile(r"final answer\s*:\s*\**\s*(true|false)\b", re.I)


class JudgeError(UserError):
    pass


@dataclass
class JudgeSpec(EndpointSettings):  # endpoint ("" = no LLM judge), model, api_key_env: r3rag.generation.endpoint
    concurrency: int = 32  # requests in flight at once


def parse_verdict(reply: str) -> bool:
    found = _VERDICT.findall(reply)
    return bool(found) and found[-1].lower() == "true"


class AnswerJudge:
    def __init__(self, client):
        self.client = client
        self.calls = 0

    @classmethod
    def from_spec(cls, spec: JudgeSpec, where: str = "judge") -> AnswerJudge:
        """The judge at `spec`'s endpoint; `where` names the settings in the one-line error when one is missing."""
        return cls(spec.client(where, concurrency=spec.concurrency))

    def judge_many(self, items: list[tuple[str, list[str], str | None]], strict: bool = True) -> list[bool | None]:
        verdicts: list[bool | None] = []
        asks, where = [], []
        for i, (question, golds, prediction) in enumerate(items):
            if not prediction or not prediction.strip():
                verdicts.append(False)
            elif exact_match(prediction, golds):
                verdicts.append(True)
            else:
                verdicts.append(None)
                where.append(i)
                asks.append(
                    [
                        {
                            "role": "user",
                            "content": JUDGE_PROMPT.format(
                                question=question, golds=" | ".join(golds), prediction=prediction
                            ),
                        }
                    ]
                )
        results = self.client.chat_many(asks, temperature=0.0) if asks else []
        for i, r in zip(where, results):
            if not r.ok:
                if strict or r.fatal:
                    raise JudgeError(f"judge endpoint {self.client.url}: {r.kind}: {r.error}")
                continue  # stays None
            verdicts[i] = parse_verdict(r.text)
        self.calls += len(asks)
        return verdicts  # type: ignore[return-value]
