"""An OpenAI-compatible chat endpoint as the rollout loop's generator (a policy or a teacher).

Chat APIs cannot continue a half-written assistant message portably, so a trajectory is sent
as a conversation: the protocol prompt is the first user message, each model turn is an
assistant message, and each environment turn (retrieved documents) is a user message. The
protocol's stop strings go in `stop`; servers drop the stop string from the reply, so the
closing tag the reply left open is put back (`</search>` or `</answer>`). All contexts of a
turn go out concurrently (the client's `concurrency`).

A request that still fails after the client's retries stops the run with a one-line error
naming the endpoint (`EndpointError`): an evaluation or a teacher never silently scores a
failed request as a wrong answer. Callers that want per-question failures catch it per batch
or use `ChatClient.chat_many` directly.

Usage:
    client = ChatClient("http://127.0.0.1:8000/v1", "Qwen2.5-7B-Instruct", concurrency=32)
    gen = ChatGenerator(client, protocol, temperature=0.0)
    trajs = run_rollouts(questions, gen, retriever, protocol, EnvConfig(mode="iterative"))
"""

from __future__ import annotations

from r3rag.env import Generated, Trajectory
from r3rag.errors import UserError
from r3rag.protocol import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, Protocol


class EndpointError(UserError):
    pass


class ChatGenerator:
    def __init__(self, client, protocol: Protocol, temperature: float = 0.0, seed: int | None = None):
        self.client, self.protocol = client, protocol
        self.temperature, self.seed = temperature, seed
        self.completion_tokens = 0

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        params = {"temperature": self.temperature, "max_tokens": max_new_tokens, "stop": list(stop)}
        if self.seed is not None:
            params["seed"] = self.seed
        results = self.client.chat_many([self.messages(t) for t in contexts], **params)
        out = []
        for traj, r in zip(contexts, results):
            if not r.ok:
                raise EndpointError(f"endpoint {self.client.url}: question {traj.id}: {r.kind}: {r.error}")
            self.completion_tokens += r.completion_tokens
            text = self._answer_prefilled(traj, close_open_tag(r.text))
            out.append(Generated(text, None, "length" if r.finish_reason == "length" else "stop"))
        return out

    def messages(self, traj: Trajectory) -> list[dict]:
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
                return stripped[len(ANSWER_OPEN):]
        return text


def close_open_tag(text: str) -> str:
    """Put back the stop string the server dropped: the last opened action tag, if unclosed."""
    for open_tag, close_tag in ((SEARCH_OPEN, SEARCH_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE)):
        at = text.rfind(open_tag)
        if at >= 0 and close_tag not in text[at:]:
            return text.rstrip() + f" {close_tag}"
    return text
