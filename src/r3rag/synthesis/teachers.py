"""Teachers that write trajectories for the cold start, and the checks that accept or reject them.

`oracle` follows a question's gold reasoning chain through the REAL retriever. It writes the
queries; whether the retriever returns the needed document is checked afterwards, so its
acceptance rate measures retrieval too. The chain comes from the question's metadata:

- `chain` (synthetic world): one query per hop (query, fact, value, doc_id); a named question
  states its first `stated` hops, so the oracle searches only the rest.
- `question_decomposition` (MuSiQue, via `r3rag import`): each sub-question with the earlier
  hops' answers filled in for `#k`; the hop's gold paragraph must come back.
- `supporting_titles` (HotpotQA, 2WikiMultiHopQA): search the question first, then each gold
  title not retrieved yet, preferring one the documents so far mention (the bridge entity).
  Which retrieved documents count as found is r3rag.core.gold_docs' rule, as in eval's recall.

Every query must be grounded: a value or title the oracle puts into a query must occur (at least
half of its content words) in the question or in a document it retrieved earlier, so it never
uses knowledge a model could not have had.

`reader` is the oracle for reader baselines (`qa` template, no searching): its one turn is the
gold answer after the prefilled `<answer> `, whether the prompt holds no documents (closed-book),
the retriever's top k, or the gold documents (r3rag.data.gold).

Usage:
    gen = oracle_generator(questions, protocol)
    gen = reader_generator(questions, Protocol(template="qa"))      # "<gold answer> </answer>"
    trajs = run_rollouts(questions, gen, retriever, protocol, env_cfg)
    ok, reason = verify(traj, question, protocol, match="exact")   # format, finish, answer
    ok, reason = verify_evidence(traj, question)                    # oracle: gold docs found, grounded
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from r3rag.core.env import Trajectory
from r3rag.core.gold_docs import flat, gold_docs, title_key
from r3rag.core.metrics import cover_match, exact_match
from r3rag.core.protocol import Protocol
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.util.errors import UserError


def gold_kind(question: dict) -> str | None:
    """Which gold chain the question carries (chain, decomposition, titles), or None."""
    meta = question.get("metadata") or {}
    if meta.get("chain"):
        return "chain"
    if meta.get("question_decomposition") and meta.get("paragraphs"):
        return "decomposition"
    gold = gold_docs(question)
    return "titles" if gold is not None and gold.by == "title" else None


def chain_kind(question: dict) -> str:
    kind = gold_kind(question)
    if kind is None:
        raise UserError(
            f"question {question.get('id')!r}: the oracle teacher needs gold hops in metadata (chain, "
            "question_decomposition with paragraphs, or supporting_titles); import real data with "
            "`r3rag import`"
        )
    return kind


def oracle_hops(question: dict) -> list[dict]:
    """The fixed hops of a chain or decomposition: {query, fact, uses, gold: (title, text) or doc_id}."""
    meta = question["metadata"]
    if chain_kind(question) == "chain":
        # A named question states its first `stated` hops (it names their entities): one search
        # for the rest is the short path, and its query's entity is grounded by the question.
        chain, skip = meta["chain"], int(meta.get("stated", 0))
        return [
            {
                "query": h["query"],
                "fact": h["fact"],
                "doc_id": h["doc_id"],
                "uses": [chain[i - 1]["value"]] if i else [],
            }
            for i, h in enumerate(chain)
            if i >= skip
        ]
    paras = {p["idx"]: p for p in meta["paragraphs"]}
    hops, answers = [], []
    for i, sub in enumerate(meta["question_decomposition"]):
        refs = [int(k) for k in re.findall(r"#(\d+)", sub["question"])]
        query = re.sub(r"#(\d+)", lambda m: answers[int(m.group(1)) - 1], sub["question"])
        query = " ".join(query.replace(">>", " ").split())  # "X >> country" is a relation, not prose
        para = paras.get(sub["paragraph_support_idx"])
        if para is None:
            raise UserError(
                f"question {question['id']!r}: hop {i + 1} names paragraph "
                f"{sub['paragraph_support_idx']} which is not in metadata.paragraphs"
            )
        hops.append(
            {
                "query": query,
                "fact": f'The answer to "{query}" is {sub["answer"]}.',
                "gold": (title_key(para["title"]), _norm(para["text"])),
                "uses": [answers[k - 1] for k in refs],
            }
        )
        answers.append(sub["answer"])
    return hops


def oracle_generator(questions: list[dict], protocol: Protocol, tokenizer=None) -> ScriptedGenerator:
    plans = {str(q["id"]): (chain_kind(q), q) for q in questions}
    fixed = {qid: oracle_hops(q) for qid, (kind, q) in plans.items() if kind != "titles"}

    def script(traj: Trajectory) -> str:
        kind, q = plans[traj.id]
        answer, step = q["golden_answers"][0], traj.model_turn_count() + 1
        if kind == "titles":
            return _title_step(traj, q, protocol, step)
        hops = fixed[traj.id]
        # Restate the fact the previous search found, then take the next hop (or answer).
        thought = hops[step - 2]["fact"] if step > 1 else None
        if step <= len(hops):
            return protocol.search_turn(hops[step - 1]["query"], thought, step)
        return protocol.answer_turn(answer, thought, step)

    return ScriptedGenerator(script, tokenizer)


def _title_step(traj: Trajectory, q: dict, protocol: Protocol, step: int) -> str:
    """HotpotQA/2Wiki: the question first, then a missing gold title (a mentioned one first), then answer."""
    gold = gold_docs(q)
    titles = gold.names
    if step == 1:
        return protocol.search_turn(q["question"], "I start by searching for the question itself.", step)
    missing = gold.missing(flat(traj.documents))
    if not missing or step > len(titles) + 1:
        return protocol.answer_turn(
            q["golden_answers"][0], f"The documents about {' and '.join(titles)} give the answer.", step
        )
    seen = _words(q["question"] + " " + _seen_text(traj))
    title = next((t for t in missing if _grounded(t, seen)), missing[0])
    return protocol.search_turn(title, f"I still need the document about {title}.", step)


def verify(traj: Trajectory, question: dict, protocol: Protocol, match: str = "exact") -> tuple[bool, str]:
    """Any teacher: it answered, every turn is well formed, and the answer matches a gold one."""
    if traj.finish_reason == "error":
        kind = (traj.steps[-1].get("reason") or "error").split(":")[0]
        return False, f"teacher_error:{kind}"
    if traj.finish_reason != "answer":
        return False, f"finish:{traj.finish_reason}"
    if not protocol.is_well_formed(model_texts(traj, protocol)):
        return False, "format"
    scorer = cover_match if match == "cover" else exact_match
    if not scorer(traj.answer, question["golden_answers"]):
        return False, "wrong_answer"
    return True, "ok"


def model_texts(traj: Trajectory, protocol: Protocol) -> list[str]:
    """Each model turn as the protocol parses it: a `qa` reader's turn continues the `<answer> `
    the environment prefilled, so that prefill is put back in front of it."""
    prefill = protocol.answer_prefill() if protocol.docs_in_prompt else None
    texts = []
    for i, t in enumerate(traj.turns):
        if t.role == "model":
            before = traj.turns[i - 1] if i else None
            joined = prefill is not None and before is not None and before.role == "env" and before.text == prefill
            texts.append(prefill + t.text if joined else t.text)
    return texts


def verify_evidence(traj: Trajectory, question: dict) -> tuple[bool, str]:
    """The oracle's searches found every gold document, with queries grounded in what it had seen."""
    kind = chain_kind(question)
    if kind == "titles":
        return _verify_titles(traj, question)
    hops = oracle_hops(question)
    for i, hop in enumerate(hops):
        if i >= len(traj.documents):
            return False, f"retrieval_miss:hop{i + 1}"
        seen = _words(question["question"] + " " + _seen_text(traj, upto=i))
        if not all(_grounded(v, seen) for v in hop["uses"]):
            return False, f"ungrounded:hop{i + 1}"
        docs = traj.documents[i]
        hit = (
            hop["doc_id"] in [d["id"] for d in docs]
            if kind == "chain"
            else hop["gold"] in {(title_key(d["title"]), _norm(d["text"])) for d in docs}
        )
        if not hit:
            return False, f"retrieval_miss:hop{i + 1}"
    return True, "ok"


def _verify_titles(traj: Trajectory, question: dict) -> tuple[bool, str]:
    gold = gold_docs(question)
    for i, query in enumerate(traj.queries[1:], start=1):  # the first query is the question itself
        seen = _words(question["question"] + " " + _seen_text(traj, upto=i))
        if not _grounded(query, seen):
            return False, f"ungrounded:hop{i + 1}"
    missing = gold.missing(flat(traj.documents))
    return (False, f"retrieval_miss:{len(missing)}_of_{len(gold.names)}") if missing else (True, "ok")


def _seen_text(traj: Trajectory, upto: int | None = None) -> str:
    return " ".join(_norm(d["title"] + " " + d["text"]) for docs in traj.documents[:upto] for d in docs)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


_STOP = {"the", "a", "an", "of", "in", "on", "and", "or", "for", "to", "at", "by", "is", "was", "what", "who"}


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _grounded(phrase: str, seen: set[str]) -> bool:
    """At least half the content words of `phrase` (a title without its "(disambiguation)") occur
    in what was seen: "Richard Nixon" is grounded by "the Nixon administration"."""
    words = [w for w in _words(re.sub(r"\(.*?\)", " ", phrase)) if w not in _STOP] or list(_words(phrase))
    return 2 * sum(w in seen for w in words) >= len(words)


# ---------------------------------------------------------------- teachers behind one interface


@dataclass
class Teacher:
    """`generator(questions, temperature)` makes the generator for one attempt over `questions`."""

    name: str
    generator: Callable[[list[dict], float], object]
    tokenizer: object = None
    deterministic: bool = False  # a retry would write the same trajectory
    client: object = None

    def usage(self, gen, traj: Trajectory) -> tuple[int, int]:
        """(tokens in, tokens out) the teacher spent on `traj`."""
        if isinstance(getattr(gen, "usage", None), dict):
            return tuple(gen.usage.get(traj.id, (0, 0)))
        if self.tokenizer is None:
            return 0, 0
        context, tokens_in, tokens_out = len(traj.prompt_ids or []), 0, 0
        for t in traj.turns:
            if t.role == "model":
                tokens_in, tokens_out = tokens_in + context, tokens_out + len(t.ids or [])
            context += len(t.ids or [])
        return tokens_in, tokens_out

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def oracle_teacher(protocol: Protocol) -> Teacher:
    return Teacher("oracle", lambda qs, temperature: oracle_generator(qs, protocol), deterministic=True)


def reader_generator(questions: list[dict], protocol: Protocol) -> ScriptedGenerator:
    """A reader's one turn, the gold answer: it continues the `<answer> ` the environment
    prefilled (closed-book or documents in the prompt), as a trained reader does at eval time."""
    gold = {str(q["id"]): q["golden_answers"][0] for q in questions}
    prefill = protocol.answer_prefill()
    if not protocol.docs_in_prompt:
        raise UserError("the reader teacher writes qa answers: it needs template qa (protocol search-r1)")

    def script(traj: Trajectory) -> str:
        return protocol.answer_turn(gold[traj.id]).removeprefix(prefill)

    return ScriptedGenerator(script)


def reader_teacher(protocol: Protocol) -> Teacher:
    """The oracle as a reader: it answers every question right whatever its documents hold, so
    a reader trained on its trajectories learns the answer given those documents (or none)."""
    return Teacher("reader", lambda qs, temperature: reader_generator(qs, protocol), deterministic=True)


def endpoint_teacher(client, protocol: Protocol, on_result=None) -> Teacher:
    """An OpenAI-compatible endpoint; a request that fails for good fails that attempt only."""
    from r3rag.generation.openai_chat import ChatGenerator

    return Teacher(
        "openai",
        lambda qs, temperature: ChatGenerator(
            client, protocol, temperature, teacher=True, on_failure="record", on_result=on_result
        ),
        client=client,
    )


def hf_teacher(model_path: str, batch_size: int) -> Teacher:
    """A local transformers model (an `sft`/`rl` artifact directory, a hub id or a path), on GPU if any."""
    import torch

    from r3rag.generation.hf import HFGenerator
    from r3rag.training.modeling import load_model, load_policy, load_tokenizer

    if (Path(model_path) / "policy.json").is_file():
        model, tokenizer = load_policy(Path(model_path))
    else:
        model, tokenizer = load_model(model_path), load_tokenizer(model_path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return Teacher(
        "hf", lambda qs, temperature: HFGenerator(model, tokenizer, batch_size, temperature), tokenizer=tokenizer
    )
