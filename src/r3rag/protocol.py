"""The text protocol: tags, stop strings, prompts, parsing and document rendering.

Nothing else in r3rag builds prompts or parses model output.

The `search-r1` protocol: the model writes `<think> ... </think>` (optional),
then either `<search> query </search>` or `<answer> text </answer>`; the environment
replies with `<information> docs </information>`.

Usage:
    proto = Protocol(template="minimal", doc_style="plain")
    prompt = proto.prompt(question)
    step = proto.parse_step(model_text)    # Step(kind="search"|"answer"|"invalid", ...)
    env_text = proto.render_docs(hits)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, INFO_OPEN, INFO_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)

# Search-R1's instruction (reworded), for instruct or base models that have not seen the protocol.
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as you want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
MINIMAL_TEMPLATE = "Question : {question}\n"

_BLOCK = {kind: re.compile(re.escape(o) + r"(.*?)" + re.escape(c), re.S)
          for kind, o, c in (("search", SEARCH_OPEN, SEARCH_CLOSE), ("answer", ANSWER_OPEN, ANSWER_CLOSE))}


@dataclass
class Step:
    """One parsed model turn."""

    kind: Literal["search", "answer", "invalid"]
    text: str
    query: str | None = None
    answer: str | None = None
    reason: str | None = None


@dataclass
class Hit:
    """One retrieved document."""

    doc_id: str
    score: float
    title: str
    text: str


@dataclass
class Protocol:
    name: str = "search-r1"
    template: Literal["search-r1", "minimal"] = "search-r1"
    doc_style: Literal["search-r1", "plain"] = "search-r1"
    max_doc_chars: int = 0  # 0 = no truncation
    chat: bool = False  # wrap the prompt as a user message in the tokenizer's chat template (instruct models)

    def prompt(self, question: str) -> str:
        tpl = SEARCH_R1_INSTRUCTION if self.template == "search-r1" else MINIMAL_TEMPLATE
        return tpl.format(question=question.strip())

    def context_prompt(self, question: str, tokenizer=None) -> str:
        """The text a trajectory starts from: the prompt, inside the chat template when `chat` is
        set and the tokenizer has one (as Search-R1 prompts instruct models); the model's turns
        and the documents then continue that one assistant message."""
        prompt = self.prompt(question)
        if not (self.chat and tokenizer is not None and getattr(tokenizer, "chat_template", None)):
            return prompt
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)

    def stop_strings(self) -> tuple[str, ...]:
        return STOP_STRINGS

    def parse_step(self, text: str) -> Step:
        """Parse one model turn; malformed output is an `invalid` step with a reason, never an exception."""
        blocks = {kind: rx.findall(text) for kind, rx in _BLOCK.items()}
        n_actions = len(blocks["search"]) + len(blocks["answer"])
        if n_actions > 1:
            return Step("invalid", text, reason="more than one action in a turn")
        if blocks["answer"]:
            answer = blocks["answer"][0].strip()
            if not answer:
                return Step("invalid", text, reason="empty answer")
            return Step("answer", text, answer=answer)
        if blocks["search"]:
            query = blocks["search"][0].strip()
            if not query:
                return Step("invalid", text, reason="empty query")
            return Step("search", text, query=query)
        for tag, close in ((SEARCH_OPEN, SEARCH_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE)):
            if tag in text:
                return Step("invalid", text, reason=f"unclosed {tag}")
        return Step("invalid", text, reason="no <search> or <answer> in the turn")

    def render_docs(self, hits: list[Hit]) -> str:
        """The environment's reply to a search, as it enters the context."""
        parts = []
        for i, h in enumerate(hits, start=1):
            text = h.text if not self.max_doc_chars else h.text[: self.max_doc_chars]
            if self.doc_style == "search-r1":
                parts.append(f"Doc {i}(Title: {h.title}) {text}")
            else:
                parts.append(text)
        sep = "\n" if self.doc_style == "search-r1" else " "
        return f"\n{INFO_OPEN} {sep.join(parts)} {INFO_CLOSE}\n"

    # The three texts the oracle teacher and baselines write: kept here so the format lives in one place.
    def search_turn(self, query: str, thought: str | None = None) -> str:
        return self._think(thought) + f"{SEARCH_OPEN} {query} {SEARCH_CLOSE}"

    def answer_turn(self, answer: str, thought: str | None = None) -> str:
        return self._think(thought) + f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"

    def answer_prefill(self) -> str:
        return f"{ANSWER_OPEN} "

    @staticmethod
    def _think(thought: str | None) -> str:
        return f"{THINK_OPEN} {thought} {THINK_CLOSE} " if thought else ""

    def is_well_formed(self, model_texts: list[str]) -> bool:
        """Every turn is one closed action with balanced <think> tags and no <information> of its
        own, and the last turn answers."""
        steps = [self.parse_step(t) for t in model_texts]
        tags_ok = all(t.count(THINK_OPEN) == t.count(THINK_CLOSE) and INFO_OPEN not in t and INFO_CLOSE not in t
                      for t in model_texts)
        return bool(steps) and tags_ok and all(s.kind != "invalid" for s in steps) and steps[-1].kind == "answer"
