"""The rollout environment: one batched multi-turn loop for synthesis, RL and evaluation.

For a batch of questions, keep the unfinished trajectories; each turn make ONE batched
generate call (stopping at `</search>` / `</answer>`), parse every turn with the protocol,
send ALL new queries to the retriever in ONE batched call, append the documents as an
environment turn, and repeat until every trajectory has an answer or hits a limit.

Retrieval before the first turn: mode `rag` searches the question and appends the documents
as an environment turn, or, for a reader prompt (`qa` template), builds each prompt with them
(`Protocol.prompt(question, docs)`); the `ircot` protocol (mode iterative) also searches the
question first. Either way they are recorded as one search (`retrieved`, `documents`).

Every turn keeps its own token ids, so the completion ids and the loss mask are joined
per turn, never re-tokenised from joined text.

Usage:
    trajs = run_rollouts(examples, generator, retriever, protocol, EnvConfig(top_k=3), tokenizer)
    env_cfg = stage_cfg.env_config(mode="rag")     # a stage config extending EnvSettings
    ids, mask = trajs[0].completion()      # mask: 1 = model token, 0 = environment token
    rag = run_rollouts(examples, gen, retriever, Protocol(template="qa"), EnvConfig(mode="rag", top_k=5))
    ircot = run_rollouts(examples, gen, retriever, Protocol(name="ircot"), EnvConfig(max_turns=6))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from typing import Protocol as TypingProtocol

from r3rag.core.protocol import Protocol, Step
from r3rag.util.config import hashed_when_set

# error: the generator failed; context: the next turn's context would pass env.max_context_tokens
FinishReason = Literal["answer", "max_turns", "length", "invalid", "error", "context"]
ContextMode = Literal["keep_all", "fold"]


@dataclass
class Turn:
    role: Literal["model", "env"]
    text: str
    ids: list[int] | None = None
    logprobs: list[float] | None = None  # per id, its log-probability when sampled (RL rollouts); None otherwise
    stub_ids: list[int] | None = None  # a documents turn's folded form (env.context: fold), ids
    stub_text: str | None = None  # ... and text


@dataclass
class Trajectory:
    id: str
    question: str
    prompt: str
    prompt_ids: list[int] | None = None
    turns: list[Turn] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    retrieved: list[list[str]] = field(default_factory=list)  # doc ids per search
    documents: list[list[dict]] = field(default_factory=list)  # {id, title, text, score} per search
    answer: str | None = None
    finish_reason: FinishReason | None = None
    eos_sampled: bool = False  # its last model turn ended with an EOS the model sampled (Generated.finish == "eos")
    fold: bool = False  # env.context: fold: the context shows only the last search's documents in full

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def queries(self) -> list[str]:
        return [s["query"] for s in self.steps if s["kind"] == "search"]

    def model_turn_count(self) -> int:
        return sum(t.role == "model" for t in self.turns)

    def model_token_count(self) -> int:
        """Tokens the model wrote (the environment's documents not counted)."""
        return sum(len(t.ids or []) for t in self.turns if t.role == "model")

    def context_ids(self, upto: int | None = None) -> list[int]:
        """The ids the model continues: the prompt and every turn (the turns before `upto`: the
        context turn `upto` was sampled from), with `fold` every documents turn but the last one
        in its stub form (shown in full for the turn right after it only)."""
        ids = list(self.prompt_ids or [])
        for t, folded in self._shown(upto):
            ids.extend((t.stub_ids if folded else t.ids) or [])
        return ids

    def context_text(self) -> str:
        """`context_ids`' text: what the model sees (the prompt, turns, stubs) as one string."""
        return self.prompt + "".join(t.stub_text if folded else t.text for t, folded in self._shown())

    def _shown(self, upto: int | None = None) -> list[tuple[Turn, bool]]:
        """The turns before `upto` (all: None), each with whether the context shows its stub: with
        `fold`, every documents turn but the last one."""
        turns = self.turns if upto is None else self.turns[:upto]
        if not self.fold:
            return [(t, False) for t in turns]
        last = next((i for i in range(len(turns) - 1, -1, -1) if turns[i].stub_text is not None), None)
        return [(t, t.stub_text is not None and i != last) for i, t in enumerate(turns)]

    def completion(self) -> tuple[list[int], list[int]]:
        """Joined completion ids and the mask: 1 on model tokens, 0 on environment tokens."""
        return join_turns(self.turns)

    def completion_length(self) -> int:
        return sum(len(t.ids or []) for t in self.turns)

    def to_json(self) -> dict:
        """What `asdict` gives without the token ids and logprobs (the same keys in the same order),
        copied by hand: `asdict` deep-copies the ids it would then drop (~40% of the demo's synthesis)."""
        return {
            "id": self.id,
            "question": self.question,
            "prompt": self.prompt,
            "turns": [{"role": t.role, "text": t.text} for t in self.turns],
            "steps": [dict(s) for s in self.steps],  # JSON rows of scalars: a shallow copy detaches them
            "retrieved": [list(r) for r in self.retrieved],
            "documents": [[dict(d) for d in docs] for docs in self.documents],
            "answer": self.answer,
            "finish_reason": self.finish_reason,
            "eos_sampled": self.eos_sampled,
        }

    @classmethod
    def from_json(cls, d: dict) -> Trajectory:
        """Rebuild from `to_json` output; extra keys (gold answers, metadata...) are ignored."""
        known = {f for f in cls.__dataclass_fields__ if f != "turns"}
        kept = {k: v for k, v in d.items() if k in known}
        return cls(**kept, turns=[Turn(t["role"], t["text"]) for t in d["turns"]])


def join_turns(turns: list[Turn]) -> tuple[list[int], list[int]]:
    """The one span rule shared by SFT labels and the GRPO env_mask."""
    ids: list[int] = []
    mask: list[int] = []
    for t in turns:
        if t.ids is None:
            raise ValueError("turn has no token ids (tokenize the trajectory first)")
        ids.extend(t.ids)
        mask.extend([1 if t.role == "model" else 0] * len(t.ids))
    return ids, mask


@dataclass
class Generated:
    text: str
    ids: list[int] | None = None
    finish: Literal["stop", "eos", "length", "error"] = "stop"
    error: str | None = None  # why, when finish == "error" (e.g. an API request that failed for good)
    logprobs: list[float] | None = None  # per id, under the distribution it was sampled from (see HFGenerator)


class Generator(TypingProtocol):
    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]: ...


class Retriever(TypingProtocol):
    def search(self, queries: list[str], k: int) -> list: ...


@dataclass
class EnvConfig:
    mode: Literal["iterative", "direct", "rag"] = "iterative"
    max_turns: int = 6
    top_k: int = 3
    max_new_tokens: int = 64
    max_completion_tokens: int = 1024
    context: ContextMode = "keep_all"  # fold: each search's documents in full for one turn, then a stub
    max_context_tokens: int = 0  # the most context a turn may start from (+ max_new_tokens); 0: no such budget


@dataclass
class EnvSettings:
    """The rollout settings a stage config shares with the others that roll out (synthesize, rl,
    eval extend it: the same keys everywhere, each stage with its own defaults where they differ)."""

    top_k: int = 3  # documents per search
    max_turns: int = 6  # model turns per trajectory
    max_new_tokens: int = 48  # token budget per model turn
    # keep_all: every document stays in the context; fold: a search's documents are shown in full
    # for the next turn only, then as a stub (their titles): the model's notes carry what it read
    context: ContextMode = hashed_when_set("keep_all", silent=True)
    # the most tokens a turn's context may hold, its max_new_tokens included (0: no such budget,
    # max_completion_tokens alone); a trajectory that would pass it ends with finish reason "context"
    max_context_tokens: int = hashed_when_set(0, silent=True)

    def env_config(self, mode: str = "iterative", max_completion_tokens: int = 1024, top_k: int = 0) -> EnvConfig:
        """The loop's EnvConfig; `top_k` > 0 replaces the setting (a system's own depth)."""
        return EnvConfig(
            mode=mode,
            top_k=top_k or self.top_k,
            max_turns=self.max_turns,
            max_new_tokens=self.max_new_tokens,
            max_completion_tokens=max_completion_tokens,
            context=self.context,
            max_context_tokens=self.max_context_tokens,
        )


def _encode(tokenizer, text: str) -> list[int] | None:
    return None if tokenizer is None else tokenizer.encode(text, add_special_tokens=False)


def _encode_many(tokenizer, texts: list[str]) -> list[list[int] | None]:
    """The ids of each text, in one batched call (a fast tokenizer's batch runs in Rust)."""
    if tokenizer is None or not texts:
        return [None] * len(texts)
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def new_trajectory(example: dict, protocol: Protocol, tokenizer=None, docs: list | None = None) -> Trajectory:
    """`docs`: hits rendered inside the prompt (a `qa` reader's single-shot RAG), recorded as one search."""
    prompt = protocol.context_prompt(example["question"], tokenizer, docs=docs)
    traj = Trajectory(
        id=str(example["id"]), question=example["question"], prompt=prompt, prompt_ids=_encode(tokenizer, prompt)
    )
    if docs is not None:
        _record_hits(traj, docs)
    return traj


def add_env_turn(traj: Trajectory, text: str, tokenizer=None) -> None:
    traj.turns.append(Turn("env", text, _encode(tokenizer, text)))


def add_search_results(trajs: list[Trajectory], hits: list[list], protocol: Protocol, tokenizer=None) -> None:
    """Each trajectory's search hits, recorded and appended as its documents turn (with its
    folded form where the trajectory folds its context)."""
    texts = [protocol.render_docs(h) for h in hits]
    stubs = [protocol.render_stub(h) if t.fold else None for t, h in zip(trajs, hits)]
    stub_ids = _encode_many(tokenizer, [s for s in stubs if s is not None])
    stub_ids_by_row = iter(stub_ids)
    for traj, found, text, ids, stub in zip(trajs, hits, texts, _encode_many(tokenizer, texts), stubs):
        _record_hits(traj, found)
        folded = (stub, next(stub_ids_by_row)) if stub is not None else (None, None)
        traj.turns.append(Turn("env", text, ids, stub_text=folded[0], stub_ids=folded[1]))


def _record_hits(traj: Trajectory, found: list) -> None:
    """One search's hits, as gold-document recall and the search count read them."""
    traj.retrieved.append([h.doc_id for h in found])
    traj.documents.append(
        [{"id": h.doc_id, "title": h.title, "text": h.text, "score": round(h.score, 4)} for h in found]
    )


def _start(examples: list[dict], retriever, protocol: Protocol, cfg: EnvConfig, tokenizer) -> list[Trajectory]:
    """The trajectories, with the question's documents when the mode or protocol searches it first."""
    if cfg.mode == "rag" and protocol.docs_in_prompt:
        hits = retriever.search([ex["question"] for ex in examples], cfg.top_k)
        return [new_trajectory(ex, protocol, tokenizer, docs=h) for ex, h in zip(examples, hits)]
    trajs = [new_trajectory(ex, protocol, tokenizer) for ex in examples]
    for t in trajs:
        t.fold = cfg.context == "fold"
    if cfg.mode == "rag" or (cfg.mode == "iterative" and protocol.ircot):  # IRCoT retrieves with the question first
        add_search_results(trajs, retriever.search([t.question for t in trajs], cfg.top_k), protocol, tokenizer)
    return trajs


def _trimmed(out: Generated, protocol: Protocol, tokenizer, prefill: str) -> Generated:
    """`out` cut to the turn the protocol keeps (an IRCoT sentence, a qa answer line), ids included."""
    if protocol.ircot and out.finish == "eos":  # IRCoT: each sentence is its own completion; EOS ends it, not the loop
        eos = getattr(tokenizer, "eos_token_id", None)
        n = len(out.ids) - 1 if out.ids and out.ids[-1] == eos else None  # the loop goes on: no EOS mid-context
        out = Generated(out.text, out.ids[:n] if out.ids else out.ids, "stop", out.error, _prefix(out.logprobs, n))
    text = protocol.trim_turn(out.text, prefill)
    if text == out.text:
        return out
    ids = out.ids
    if ids is not None and tokenizer is not None:  # the shortest id prefix that decodes to the kept text
        ids = next(
            (
                ids[:j]
                for j in range(len(ids) + 1)
                if len(tokenizer.decode(ids[:j], skip_special_tokens=True)) >= len(text)
            ),
            ids,
        )
    return Generated(text, ids, out.finish, out.error, _prefix(out.logprobs, None if ids is None else len(ids)))


def _prefix(logprobs: list[float] | None, n: int | None) -> list[float] | None:
    """The logprobs of a turn whose ids were cut to their first `n` (None: not cut)."""
    return logprobs if logprobs is None or n is None else logprobs[:n]


def run_rollouts(
    examples: list[dict],
    generator: Generator,
    retriever: Retriever | None,
    protocol: Protocol,
    cfg: EnvConfig,
    tokenizer=None,
    on_turn=None,
) -> list[Trajectory]:
    """Run the batched loop to completion; `on_turn(n_done, n_total)` reports progress."""
    trajs = _start(examples, retriever, protocol, cfg, tokenizer)
    prefill = protocol.answer_prefill() if cfg.mode in ("direct", "rag") else ""
    for turn_no in range(cfg.max_turns):
        active = [t for t in trajs if not t.done]
        if not active:
            break
        if prefill:
            for t in active:
                add_env_turn(t, prefill, tokenizer)
        active = _within_budget(active, cfg, tokenizer)
        if not active:
            continue
        outs = generator.generate(active, protocol.stop_strings(), cfg.max_new_tokens)
        searching = []
        for t, out in zip(active, outs):
            out = _trimmed(out, protocol, tokenizer, prefill)
            t.turns.append(Turn("model", out.text, out.ids, out.logprobs))
            t.eos_sampled = out.finish == "eos"  # that EOS alone gets gradient in RL (completion_with_eos)
            step = (
                Step("invalid", out.text, reason=out.error)
                if out.finish == "error"
                else protocol.parse_step(prefill + out.text, ended=out.finish == "eos")
            )
            t.steps.append(_step_record(step))
            _finish_or_continue(t, step, out, turn_no, cfg, searching)
        if searching:
            hits = retriever.search([t.steps[-1]["query"] for t in searching], cfg.top_k)
            add_search_results(searching, hits, protocol, tokenizer)
            for t in searching:
                if tokenizer is not None and t.completion_length() > cfg.max_completion_tokens:
                    t.finish_reason = "length"
        if on_turn:
            on_turn(sum(t.done for t in trajs), len(trajs))
    for t in trajs:
        if not t.done:
            t.finish_reason = "max_turns"
    return trajs


def _within_budget(active: list[Trajectory], cfg: EnvConfig, tokenizer) -> list[Trajectory]:
    """The trajectories whose next turn fits `max_context_tokens` (context + max_new_tokens); the
    others end here with finish reason "context", never a context cut short."""
    if not cfg.max_context_tokens or tokenizer is None:
        return active
    for t in active:
        if len(t.context_ids()) + cfg.max_new_tokens > cfg.max_context_tokens:
            t.finish_reason = "context"
    return [t for t in active if not t.done]


def check_env_settings(cfg: EnvSettings, stage: str) -> None:
    """The context settings, one clear line each (a stage's validate calls it)."""
    from r3rag.util.errors import UserError

    if cfg.max_context_tokens < 0:
        raise UserError(f"{stage}.max_context_tokens: expected 0 (no budget) or more, got {cfg.max_context_tokens}")
    if cfg.max_context_tokens and cfg.max_context_tokens <= cfg.max_new_tokens:
        raise UserError(
            f"{stage}.max_context_tokens: {cfg.max_context_tokens} leaves no room for a prompt beside "
            f"max_new_tokens ({cfg.max_new_tokens}); set more, or 0 for no budget"
        )


def _step_record(step: Step) -> dict:
    return {"kind": step.kind, "query": step.query, "answer": step.answer, "reason": step.reason}


def _finish_or_continue(
    t: Trajectory, step: Step, out: Generated, turn_no: int, cfg: EnvConfig, searching: list
) -> None:
    if step.kind == "answer":
        t.answer, t.finish_reason = step.answer, "answer"
    elif step.kind == "invalid" or out.finish == "eos":  # EOS closes the message: nothing may follow it
        t.finish_reason = out.finish if out.finish in ("length", "error") else "invalid"
    elif turn_no == cfg.max_turns - 1 or cfg.mode != "iterative":
        t.finish_reason = "max_turns"
    else:
        searching.append(t)
