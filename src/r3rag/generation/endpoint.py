"""Generation through an OpenAI-compatible chat endpoint (a teacher such as DeepSeek, or a vLLM server).

Each turn sends one chat request per unfinished trajectory, all concurrently (the client's
`concurrency` in flight); the prompt comes from the protocol (`teacher_messages`), and the
stop string the API leaves out is put back (`close_turn`). A request that fails for good
becomes a `finish="error"` turn for that trajectory only; a fatal one (bad key, URL or model)
stops the run with one clear error.

Usage:
    gen = EndpointGenerator(ChatClient(url, model, concurrency=32), protocol, temperature=0.0)
    trajs = run_rollouts(questions, gen, retriever, protocol, env_cfg)
    gen.usage["q1"]      # [prompt_tokens, completion_tokens] summed over q1's requests
"""

from __future__ import annotations

from collections import defaultdict

from r3rag.env import Generated, Trajectory
from r3rag.errors import UserError
from r3rag.llm.openai_client import ChatClient
from r3rag.protocol import Protocol


class EndpointGenerator:
    def __init__(self, client: ChatClient, protocol: Protocol, temperature: float = 0.0, tokenizer=None,
                 on_result=None, **params):
        self.client, self.protocol, self.temperature = client, protocol, temperature
        self.tokenizer, self.on_result, self.params = tokenizer, on_result, params
        self.usage: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        requests = [self.protocol.teacher_messages(c) for c in contexts]
        results = self.client.chat_many(requests, on_result=self.on_result, temperature=self.temperature,
                                        max_tokens=max_new_tokens, stop=list(self.protocol.api_stop_strings()),
                                        **self.params)
        fatal = next((r for r in results if not r.ok and r.fatal), None)
        if fatal is not None:
            raise UserError(f"teacher endpoint {self.client.url} (model {self.client.model!r}): {fatal.error}")
        outs = []
        for c, r in zip(contexts, results):
            if not r.ok:
                outs.append(Generated("", None, "error", error=f"{r.kind}: {r.error}"))
                continue
            self.usage[c.id][0] += r.prompt_tokens
            self.usage[c.id][1] += r.completion_tokens
            text = self.protocol.close_turn(r.text) if r.finish_reason == "stop" else r.text
            ids = None if self.tokenizer is None else self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(Generated(text, ids, "length" if r.finish_reason == "length" else "stop"))
        return outs
