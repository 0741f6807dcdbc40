"""The text protocol: tags, stop strings, prompts, parsing and document rendering.

Nothing else in r3rag builds prompts or parses model output (the fixed strings, tags and
templates, are in r3rag.core.protocol_text, re-exported here).

Three protocols (`Protocol(name=...)`):

- `search-r1`: the model writes `<think> ... </think>` (optional), then either
  `<search> query </search>` or `<answer> text </answer>`; the environment replies with
  `<information> docs </information>`.
- `r3rag`: R3-RAG's step format. The prompt is `The question: ...`; each model turn is
  `Step k:` / `The problem analysis: ...` / `The retrieval query: ...` ending with
  `The retrieval documents:` (its stop string), or `The final answer: ...`; the environment
  appends the documents after that marker. `template` does not apply.
- `ircot`: IRCoT (Trivedi et al. 2023) for prompted models. The environment first retrieves
  with the question; each model turn is ONE chain-of-thought sentence (stops `. ` and `.\n`),
  which is the next retrieval query, until a sentence says "So the answer is: X".
  `template` does not apply.

Templates (search-r1 protocol): `search-r1` (Search-R1's instruction), `minimal`, and `qa`: a
reader prompt for prompted baselines (answer with a short phrase inside <answer> tags); with
`docs` (single-shot RAG) the documents go inside the user message, before the question. A
prompted model often leaves the prefilled `<answer>` open: the answer is then its first line
(ended by a newline, or by the model's end of turn), and the turn is cut after that line.

Teachers behind a chat API get their prompt here too (`teacher_messages`): the full
instruction whatever the student's template, and `close_turn` puts back the stop string an
API cut off.

Usage:
    proto = Protocol(template="minimal", doc_style="plain")      # or Protocol(name="r3rag")
    prompt = proto.prompt(question)
    prompt = Protocol(template="qa").prompt(question, docs=hits)   # reader prompt with its documents
    step = proto.parse_step(model_text)    # Step(kind="search"|"answer"|"invalid", ...)
    env_text = proto.render_docs(hits)
    messages = proto.teacher_messages(trajectory)                # chat messages for the next turn
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from r3rag.core.protocol_text import (  # noqa: F401  (re-exported: the tags are part of this module's interface)
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    IRCOT_ANSWER,
    IRCOT_INSTRUCTION,
    IRCOT_STOP_STRINGS,
    MINIMAL_TEMPLATE,
    QA_DOCS_INSTRUCTION,
    QA_INSTRUCTION,
    QA_SHORT,
    QA_STOP_STRINGS,
    R3_ANALYSIS,
    R3_ANSWER,
    R3_DOCS,
    R3_QUERY,
    R3_QUESTION,
    R3_STEP,
    R3_STOP_STRINGS,
    R3RAG_TEACHER_INSTRUCTION,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    SEARCH_R1_INSTRUCTION,
    STOP_STRINGS,
    TAGS,
    THINK_CLOSE,
    THINK_OPEN,
)

_IRCOT_ANSWER_RX = re.compile(r".*answer is\s*:?(.*)", re.I | re.S)  # the last "answer is" in the turn


_BLOCK = {
    kind: re.compile(re.escape(o) + r"(.*?)" + re.escape(c), re.S)
    for kind, o, c in (("search", SEARCH_OPEN, SEARCH_CLOSE), ("answer", ANSWER_OPEN, ANSWER_CLOSE))
}


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


# The protocol's choices, once: stage configs type their settings with these aliases, so a
# misspelled value is one line naming the allowed ones wherever it is read.
ProtocolName = Literal["search-r1", "r3rag", "ircot"]
Template = Literal["search-r1", "minimal", "qa"]  # prompts of the search-r1 protocol
DocStyle = Literal["search-r1", "plain"]
PROTOCOLS, TEMPLATES, DOC_STYLES = get_args(ProtocolName), get_args(Template), get_args(DocStyle)
CHOICES = {"name": PROTOCOLS, "template": TEMPLATES, "doc_style": DOC_STYLES}  # Protocol's Literal fields


@dataclass
class ProtocolSettings:
    """The protocol keys of a config (synthesize's, an eval system's): the same names and choices
    wherever a protocol is chosen; each config keeps its own defaults where they differ."""

    protocol: ProtocolName = "search-r1"  # the protocol's name
    template: Template = "search-r1"  # search-r1's prompt (r3rag and ircot have their own)
    doc_style: DocStyle = "search-r1"  # how documents are rendered
    chat: bool = False  # the prompt inside the tokenizer's chat template (instruct models)
    max_doc_chars: int = 0  # cut each retrieved document to this many characters (0 = whole)

    def to_protocol(self) -> Protocol:
        return Protocol(self.protocol, self.template, self.doc_style, self.max_doc_chars, self.chat)


@dataclass
class Protocol:
    name: ProtocolName = "search-r1"
    template: Template = "search-r1"
    doc_style: DocStyle = "search-r1"
    max_doc_chars: int = 0  # 0 = no truncation
    chat: bool = False  # wrap the prompt as a user message in the tokenizer's chat template (instruct models)

    def __post_init__(self):
        # Literal is only a hint: a misspelled template would silently prompt like search-r1.
        for key, allowed in CHOICES.items():
            value = getattr(self, key)
            if value not in allowed:
                from r3rag.util.errors import UserError

                what = "protocol" if key == "name" else key
                raise UserError(f"protocol.{key}: unknown {what} {value!r} (allowed: {', '.join(allowed)})")

    @property
    def r3(self) -> bool:
        return self.name == "r3rag"

    @property
    def ircot(self) -> bool:
        return self.name == "ircot"

    @property
    def docs_in_prompt(self) -> bool:
        """Single-shot RAG puts its documents in the prompt (the `qa` reader), not in an env turn."""
        return self.name == "search-r1" and self.template == "qa"

    def prompt(self, question: str, docs: list[Hit] | None = None) -> str:
        """`docs`: the documents of a single-shot RAG reader (`qa` template only)."""
        if docs is not None and not self.docs_in_prompt:
            raise ValueError(f"protocol {self.name}/{self.template}: documents go in env turns, not the prompt")
        if self.r3:
            return R3_QUESTION.format(question=question.strip())
        if self.ircot:
            return IRCOT_INSTRUCTION.format(question=question.strip())
        if self.template == "qa":
            if docs is None:
                return QA_INSTRUCTION.format(question=question.strip())
            return QA_DOCS_INSTRUCTION.format(docs=self._doc_text(docs), question=question.strip())
        tpl = SEARCH_R1_INSTRUCTION if self.template == "search-r1" else MINIMAL_TEMPLATE
        return tpl.format(question=question.strip())

    def context_prompt(self, question: str, tokenizer=None, docs: list[Hit] | None = None) -> str:
        """The text a trajectory starts from: the prompt, inside the chat template when `chat` is
        set and the tokenizer has one (as Search-R1 prompts instruct models); the model's turns
        and the documents then continue that one assistant message."""
        prompt = self.prompt(question, docs)
        if not (self.chat and tokenizer is not None and getattr(tokenizer, "chat_template", None)):
            return prompt
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )

    def stop_strings(self) -> tuple[str, ...]:
        """Where the local loop stops a model turn. A `qa` reader (its turn starts inside the
        prefilled `<answer> `) stops at its first newline, so a line break before any answer
        text leaves the answer empty (an invalid step)."""
        if self.ircot:
            return IRCOT_STOP_STRINGS
        if self.docs_in_prompt:
            return QA_STOP_STRINGS
        return R3_STOP_STRINGS if self.r3 else STOP_STRINGS

    def api_stop_strings(self) -> tuple[str, ...]:
        """Stops for a chat API, which answers one step per request: a reply that opens with
        a newline before "Step k:" must not stop at once."""
        if self.ircot:
            return IRCOT_STOP_STRINGS
        return (R3_DOCS,) if self.r3 else STOP_STRINGS

    def trim_turn(self, text: str, prefill: str = "") -> str:
        """The model turn kept: an IRCoT turn up to the end of its first sentence (a generator
        that stops at ". " has already written the next token); a `qa` turn whose `<answer>`
        (in `prefill` + text) is still open, up to the end of the answer's first line; other
        protocols, unchanged."""
        if self.ircot:
            return _first_sentence(text)
        if self.docs_in_prompt:
            return _first_answer_line(prefill, text)
        return text

    def parse_step(self, text: str, ended: bool = False) -> Step:
        """Parse one model turn; malformed output is an `invalid` step with a reason, never an exception.
        `ended`: the model ended the turn itself (end of sequence); a `qa` answer left open then counts."""
        if self.r3:
            return _parse_r3_step(text)
        if self.ircot:
            return _parse_ircot_step(text)
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
        if self.docs_in_prompt and ANSWER_OPEN in text:
            answer = _open_answer(text, ended)
            if answer:
                return Step("answer", text, answer=answer)
        for tag in (SEARCH_OPEN, ANSWER_OPEN):
            if tag in text:
                return Step("invalid", text, reason=f"unclosed {tag}")
        return Step("invalid", text, reason="no <search> or <answer> in the turn")

    def render_docs(self, hits: list[Hit]) -> str:
        """The environment's reply to a search, as it enters the context."""
        if self.r3:  # follows the model's "The retrieval documents:"
            return f" {self._doc_text(hits)}\n"
        return f"\n{INFO_OPEN} {self._doc_text(hits)} {INFO_CLOSE}\n"

    def render_stub(self, hits: list[Hit]) -> str:
        """A search's documents once folded (`env.context: fold`): their titles only, where the
        documents stood. What the model read from them lives on in its own text: the thought it
        writes before its next action is its note (`<think> X works for Y . </think>`)."""
        titles = " , ".join(dict.fromkeys(h.title for h in hits)) or "-"
        if self.r3:
            return f" {titles}\n"
        return f"\n{INFO_OPEN} {titles} {INFO_CLOSE}\n"

    def _doc_text(self, hits: list[Hit]) -> str:
        """The documents in `doc_style`, as an env turn or a reader prompt holds them."""
        parts = []
        for i, h in enumerate(hits, start=1):
            text = h.text if not self.max_doc_chars else h.text[: self.max_doc_chars]
            if self.doc_style == "search-r1":
                parts.append(f"Doc {i}(Title: {h.title}) {text}")
            else:
                parts.append(text)
        sep = "\n" if self.doc_style == "search-r1" else " "
        return sep.join(parts)

    # The texts the oracle teacher and baselines write: kept here so the format lives in one place.
    def search_turn(self, query: str, thought: str | None = None, step: int = 1) -> str:
        if self.r3:
            return self._r3_head(step, thought) + f"{R3_QUERY} {query}\n{R3_DOCS}"
        if self.ircot:  # the sentence is the query: a thought would change what is searched
            return query.strip()
        return self._think(thought) + f"{SEARCH_OPEN} {query} {SEARCH_CLOSE}"

    def answer_turn(self, answer: str, thought: str | None = None, step: int = 1) -> str:
        if self.r3:
            return self._r3_head(step, thought) + f"{R3_ANSWER} {answer}"
        if self.ircot:
            return f"{IRCOT_ANSWER} {answer}."
        return self._think(thought) + f"{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"

    def answer_prefill(self) -> str:
        if self.ircot:
            return f"{IRCOT_ANSWER} "
        return f"{R3_STEP.format(k=1)}\n{R3_ANSWER} " if self.r3 else f"{ANSWER_OPEN} "

    @staticmethod
    def _r3_head(step: int, thought: str | None) -> str:
        return f"{R3_STEP.format(k=step)}\n{R3_ANALYSIS} {thought or 'I need more information.'}\n"

    @staticmethod
    def _think(thought: str | None) -> str:
        return f"{THINK_OPEN} {thought} {THINK_CLOSE} " if thought else ""

    def is_well_formed(self, model_texts: list[str]) -> bool:
        """Every turn is one closed action with balanced <think> tags and no <information> of its
        own, and the last turn answers."""
        steps = [self.parse_step(t) for t in model_texts]
        tags_ok = all(
            t.count(THINK_OPEN) == t.count(THINK_CLOSE) and INFO_OPEN not in t and INFO_CLOSE not in t
            for t in model_texts
        )
        return bool(steps) and tags_ok and all(s.kind != "invalid" for s in steps) and steps[-1].kind == "answer"

    # ---------------------------------------------------------------- teachers behind a chat API

    def teacher_messages(self, traj) -> list[dict]:
        """Chat messages asking a teacher for the next turn of `traj` (an env.Trajectory).

        search-r1: a multi-turn chat (the instruction, then model turns as the assistant's and
        documents as the user's). r3rag: one fresh user message holding the instruction and the
        whole context so far, as R3-RAG prompts its teacher."""
        if self.r3:
            context = traj.prompt + "".join(t.text for t in traj.turns)
            k = sum(t.role == "model" for t in traj.turns) + 1
            return [{"role": "user", "content": R3RAG_TEACHER_INSTRUCTION.format(k=k, context=context)}]
        question = traj.question.strip()
        first = self.prompt(question) if self.ircot else SEARCH_R1_INSTRUCTION.format(question=question)
        messages = [{"role": "user", "content": first}]
        for t in traj.turns:
            messages.append({"role": "assistant" if t.role == "model" else "user", "content": t.text.strip()})
        return messages

    def close_turn(self, text: str) -> str:
        """A turn an API stopped at a stop string, with that string put back (APIs leave it out):
        the last opened action tag closed, or an r3rag query step ended with its documents marker."""
        if self.r3:
            if _parse_r3_step(text).kind == "search" and not text.rstrip().endswith(R3_DOCS):
                return text.rstrip() + f"\n{R3_DOCS}"
            return text
        for open_, close in ((SEARCH_OPEN, SEARCH_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE)):
            if open_ in text and close not in text[text.rindex(open_) :]:
                return text.rstrip() + f" {close}"
        return text


def _parse_r3_step(text: str) -> Step:
    n_query, n_answer = text.count(R3_QUERY), text.count(R3_ANSWER)
    if n_query + n_answer > 1:
        return Step("invalid", text, reason="more than one action in a step")
    if n_answer:
        answer = text.split(R3_ANSWER, 1)[1].split("\n")[0].strip()
        if not answer:
            return Step("invalid", text, reason="empty answer")
        return Step("answer", text, answer=answer)
    if n_query:
        query = text.split(R3_QUERY, 1)[1].split(R3_DOCS)[0].split("\n")[0].strip()
        if "?" in query:  # R3-RAG cuts a query after its question mark
            query = query[: query.index("?") + 1]
        if not query:
            return Step("invalid", text, reason="empty query")
        return Step("search", text, query=query)
    return Step("invalid", text, reason=f"no '{R3_QUERY}' or '{R3_ANSWER}' in the step")


def _parse_ircot_step(text: str) -> Step:
    """An IRCoT sentence: the answer when it says "... answer is: X", else the next query."""
    m = _IRCOT_ANSWER_RX.search(text)
    if m:
        answer = m.group(1).strip().split("\n")[0].strip().rstrip(".").strip()
        return Step("answer", text, answer=answer) if answer else Step("invalid", text, reason="empty answer")
    query = text.strip()
    return Step("search", text, query=query) if query else Step("invalid", text, reason="empty sentence")


def _first_sentence(text: str) -> str:
    """`text` up to its first sentence end: the "." of ". ", or a newline after some text (kept)."""
    start = len(text) - len(text.lstrip())
    ends = [i + 1 for i in (text.find(". ", start),) if i >= 0]
    ends += [i + 1 for i in (text.find("\n", start),) if i >= 0]
    return text[: min(ends)] if ends else text


def _first_answer_line(prefill: str, text: str) -> str:
    """`text` cut after the newline that ends the first line of an open `<answer>` (unchanged otherwise)."""
    full = prefill + text
    if ANSWER_OPEN not in full or ANSWER_CLOSE in full:
        return text
    content = full.index(ANSWER_OPEN) + len(ANSWER_OPEN)
    start = content + len(full[content:]) - len(full[content:].lstrip())
    end = full.find("\n", start)
    return text if end < 0 else full[: end + 1][len(prefill) :]


def _open_answer(text: str, ended: bool) -> str | None:
    """The first line of an `<answer>` left open, once that line is complete (a newline ends it,
    or the model ended its turn); None otherwise (e.g. cut by the token limit)."""
    content = text.split(ANSWER_OPEN, 1)[1].lstrip()
    if not content or not (ended or "\n" in content):
        return None
    return content.split("\n")[0].strip() or None
