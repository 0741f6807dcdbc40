"""An OpenAI-compatible chat endpoint as the rollout loop's generator (a policy or a teacher).

Chat APIs cannot continue a half-written assistant message portably, so a trajectory is sent
as a conversation: the protocol prompt is the first user message, each model turn is an
assistant message, and each environment turn (retrieved documents) is a user message. The
protocol's stop strings go in `stop`; servers drop the stop string from the reply, so the
closing tag the reply left open is put back (`</search>` or `</answer>`). All contexts of a
turn go out concurrently (the client's `concurrency`).

A request that still fails after the client's retries stops the run with a one-line error
naming the endpoint (`EndpointError`): an evaluation never silently scores a failed request as
a wrong answer. A teacher (`on_failure="record"`) instead ends that trajectory with
`finish_reason="error"` and the failure's kind, so one question fails, not the run; a fatal
failure (401/403/404: wrong key, URL or model) still stops it.

`teacher=True` asks with the protocol's teacher prompt (`Protocol.teacher_messages`: the full
instruction whatever the student's template; for `r3rag`, one message holding the context so
far, as R3-RAG prompts its teacher). `usage[trajectory id]` sums [prompt, completion] tokens.

Usage:
    client = ChatClient("http://127.0.0.1:8000/v1", "Qwen2.5-7B-Instruct", concurrency=32)
    gen = ChatGenerator(client, protocol, temperature=0.0)
    trajs = run_rollouts(questions, gen, retriever, protocol, EnvConfig(mode="iterative"))
    teacher = ChatGenerator(client, protocol, 0.9, teacher=True, on_failure="record")
"""

from __future__ import annotations

from collections import defaultdict

from r3rag.core.env import Generated, Trajectory
from r3rag.core.protocol import ANSWER_OPEN, Protocol
from r3rag.util.errors import UserError


class EndpointError(UserError):
    pass


class ChatGenerator:
    def __init__(
        self,
        client,
        protocol: Protocol,
        temperature: float = 0.0,
        seed: int | None = None,
        teacher: bool = False,
        on_failure: str = "raise",
        on_result=None,
    ):
        self.client, self.protocol = client, protocol
        self.temperature, self.seed = temperature, seed
        self.teacher, self.on_failure, self.on_result = teacher, on_failure, on_result
        self.completion_tokens = 0
        self.usage: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        # The API answers one turn per request, so it gets the protocol's API stops (not the loop's).
        params = {
            "temperature": self.temperature,
            "max_tokens": max_new_tokens,
            "stop": list(self.protocol.api_stop_strings()),
        }
        if self.seed is not None:
            params["seed"] = self.seed
        results = self.client.chat_many([self.messages(t) for t in contexts], on_result=self.on_result, **params)
        out = []
        for traj, r in zip(contexts, results):
            if not r.ok:
                if self.on_failure == "raise" or r.fatal:
                    raise EndpointError(f"endpoint {self.client.url}: question {traj.id}: {r.kind}: {r.error}")
                out.append(Generated("", None, "error", error=f"{r.kind}: {r.error}"))
                continue
            self.completion_tokens += r.completion_tokens
            self.usage[traj.id][0] += r.prompt_tokens
            self.usage[traj.id][1] += r.completion_tokens
            length = r.finish_reason == "length"  # cut by max_tokens: nothing to put back
            text = self._answer_prefilled(traj, r.text if length else self.protocol.close_turn(r.text))
            out.append(Generated(text, None, "length" if length else "stop"))
        return out

    def messages(self, traj: Trajectory) -> list[dict]:
        if self.teacher:
            return self.protocol.teacher_messages(traj)
        msgs = [{"role": "user", "content": self.protocol.prompt(traj.question)}]
        for turn in traj.turns:
            role = "assistant" if turn.role == "model" else "user"
            if msgs[-1]["role"] == role:  # e.g. documents then the answer prefill: one message
                msgs[-1]["content"] += turn.text
            else:
                msgs.append({"role": role, "content": turn.text})
        return msgs

    def _answer_prefilled(self, traj: Trajectory, text: str) -> str:
        """The loop prefills `<answer> ` (direct/rag); a chat model writes the tag itself."""
        prefill = self.protocol.answer_prefill()
        if traj.turns and traj.turns[-1].role == "env" and traj.turns[-1].text.endswith(prefill):
            stripped = text.lstrip()
            if stripped.startswith(ANSWER_OPEN):
                return stripped[len(ANSWER_OPEN) :]
        return text
