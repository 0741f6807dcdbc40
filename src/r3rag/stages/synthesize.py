"""`r3rag synthesize`: teacher trajectories for the SFT cold start (R3-RAG's attempt loop).

Teachers (`teacher:`):
- `oracle`: follows each question's gold chain through the real retriever (world relation
  chains, MuSiQue decompositions, HotpotQA/2Wiki supporting titles); deterministic, one attempt.
- `openai`: any OpenAI-compatible chat endpoint (DeepSeek, vLLM, SGLang...): `base_url`,
  `model`, the API key read from the environment variable named by `api_key_env` (never
  stored); `concurrency` requests in flight, `timeout` per request, `max_retries` with backoff.
- `hf`: a local transformers model (`model`: an sft/rl artifact directory, a hub id or a path).

Per question, up to `attempts` attempts (the first greedy, later ones sampled at
`temperature`) of up to `max_turns` steps. An attempt is accepted when it answered, every
step is well formed, the answer matches a gold one (`match: exact|cover`; `judge: true` lets
an LLM judge over an OpenAI-compatible endpoint decide answers that do not match) and, for the
oracle, its searches found the gold documents with grounded queries. The first accepted attempt
goes to `trajectories.jsonl` (with the reasons of the attempts before it); a question with none
goes to `rejected.jsonl` with every attempt and its reason. A request that fails after its
retries rejects that attempt (`teacher_error:<kind>`), not the run.

Resumable: each finished question is appended (fsynced) to `runs/synthesize/.journal-<id>.jsonl`;
rerunning the same command after a crash or Ctrl-C skips finished questions and never repeats
one. The artifact appears only when every question is done.

Reader baselines (`reader`, with `template: qa`): trajectories for a reader that does not
search, trained like the cold start by `r3rag sft`. The oracle writes the gold answer after the
prefilled `<answer> `, in one of three prompts: `closed-book` (the question alone), `rag` (the
retriever's `top_k` documents for the question text, in the prompt) or `gold` (the question's
gold documents, r3rag.data.gold: the oracle reader, single-shot RAG's ceiling). Every question
is accepted: a reader learns to answer from what its prompt holds, however little.

Questions: the world artifact's `split`, or a questions file (`questions: q.jsonl`, the schema
`r3rag import` writes). `protocol: search-r1` (tags) or `r3rag` (R3-RAG's step format).
`extra_worlds: N` adds questions from N fresh synthetic worlds (same world config, derived
seeds, each with its own BM25 index built with the index artifact's settings), minus any that
mention a test entity of the evaluation world. `retriever: http://host:port` searches through a
retrieval server (`r3rag serve-retriever`) instead of the index artifact.

Usage:

    r3rag synthesize --set teacher=oracle --set top_k=3
    r3rag synthesize --set questions=hotpot_train.jsonl --set protocol=r3rag
    r3rag synthesize --set reader=rag --set template=qa --set top_k=12   # a single-shot RAG reader's data
    r3rag synthesize --set teacher=openai --set base_url=https://api.deepseek.com --set model=deepseek-chat \\
        --set api_key_env=DEEPSEEK_API_KEY --set questions=hotpot_train.jsonl --set concurrency=32
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from r3rag import teachers
from r3rag.data.gold import GoldRetriever
from r3rag.env import EnvConfig, run_rollouts
from r3rag.errors import UserError
from r3rag.journal import Journal
from r3rag.jsonl import read_jsonl, write_jsonl
from r3rag.judge import AnswerJudge
from r3rag.protocol import DocStyle, Protocol, ProtocolName, Template
from r3rag.retrieval import is_url, open_retriever
from r3rag.stages.common import (
    FILE,
    Context,
    add_model_input,
    load_questions,
    model_location,
    resolve_inputs,
    set_threads,
)

INPUTS = {"world": "world", "index": "index", "questions": FILE}
# The rollout mode each reader runs in: gold documents reach the prompt through rag mode, the
# gold retriever answering the question text (r3rag.data.gold).
READER_MODES = {"none": "iterative", "closed-book": "direct", "rag": "rag", "gold": "rag"}
# How fast a run goes, not what it writes: kept out of the artifact id, so a rerun with other
# values still resumes the same journal.
OPERATIONAL = ("concurrency", "timeout", "max_retries", "batch_size", "gen_batch_size", "threads")


@dataclass
class Config:
    name: str = "default"
    world: str = "world:latest"
    index: str = "index:latest"
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    questions: str = ""  # a questions file (r3rag import's schema) instead of the world's split
    split: str = "train"
    limit: int = 0  # 0 = every question
    extra_worlds: int = 0
    extra_questions_per_world: int = 400
    extra_world_clusters: int = 10  # size of each extra world; 0 = same as the evaluation world
    teacher: Literal["oracle", "openai", "hf"] = "oracle"
    reader: Literal["none", "closed-book", "rag", "gold"] = "none"  # a reader baseline's data (template qa)
    protocol: ProtocolName = "search-r1"  # the protocol's name
    template: Template = "search-r1"
    doc_style: DocStyle = "search-r1"
    chat: bool = False  # the student is an instruct model: prompts inside its chat template (sft, rl, eval)
    max_doc_chars: int = 0  # cut each retrieved document to this many characters (0 = whole)
    top_k: int = 3
    max_turns: int = 6
    max_new_tokens: int = 256  # per step (openai, hf)
    attempts: int = 3
    temperature: float = 0.9  # attempts after the first (which is greedy)
    match: str = "exact"  # exact or cover
    judge: bool = False  # an LLM judge decides answers that do not match
    base_url: str = ""  # openai teacher: e.g. https://api.deepseek.com or http://127.0.0.1:8000/v1
    model: str = ""  # openai: the served model name; hf: artifact dir, hub id or path
    api_key_env: str = ""  # name of the environment variable holding the key ("" = none)
    judge_base_url: str = ""  # "" = the teacher's endpoint
    judge_model: str = ""
    judge_api_key_env: str = ""
    concurrency: int = 32
    timeout: float = 60.0
    max_retries: int = 5
    batch_size: int = 1024  # questions per rollout batch
    gen_batch_size: int = 64  # hf teacher: sequences per generate call
    threads: int = 0
    seed: int = 0


def run(cfg: Config, ctx: Context):
    _check(cfg)
    remote = is_url(cfg.retriever) and not cfg.extra_worlds  # the index is then not used at all
    fields = {
        k: v
        for k, v in INPUTS.items()
        if not (remote and k == "index") and not (k == "world" and cfg.questions and not cfg.extra_worlds)
    }
    inputs = resolve_inputs(cfg, fields, ctx)
    defaults = Config()
    fields = add_model_input(cfg.model, inputs, INPUTS, ctx) if cfg.teacher == "hf" else INPUTS
    writer = ctx.writer(
        "synthesize", dataclasses.replace(cfg, **{k: getattr(defaults, k) for k in OPERATIONAL}), inputs, fields
    )
    writer.config = dataclasses.asdict(cfg)
    if writer.existing:
        return ctx.skipped(writer)
    cfg = dataclasses.replace(cfg, model=model_location(cfg.model, inputs))  # the hf teacher loads this
    set_threads(cfg.threads)
    sources = _sources(cfg, inputs)
    protocol = Protocol(
        name=cfg.protocol,
        template=cfg.template,
        doc_style=cfg.doc_style,
        chat=cfg.chat,
        max_doc_chars=cfg.max_doc_chars,
    )
    t0 = time.time()
    with Journal(writer.final.parent / f".journal-{writer.id}.jsonl") as journal:
        resumed = len(journal.done)
        _synthesize(cfg, ctx, sources, protocol, journal)
        rows = journal.rows
        if not any(r["status"] == "accepted" for r in rows):
            reasons = dict(Counter(r["reject_reason"] for r in rows))
            raise UserError(
                f"synthesize: the teacher produced no accepted trajectory (reasons: {reasons}; "
                f"every attempt is in {journal.path})"
            )
        with writer:
            order = {q["id"]: i for i, q in enumerate(q for _, qs, _ in sources for q in qs)}
            rows = sorted(rows, key=lambda r: order.get(r["id"], len(order)))  # the same files after a resume
            accepted = [_public(r) for r in rows if r["status"] == "accepted"]
            random.Random(cfg.seed).shuffle(accepted)
            write_jsonl(writer.dir / "trajectories.jsonl", accepted)
            write_jsonl(writer.dir / "rejected.jsonl", [_public(r) for r in rows if r["status"] == "rejected"])
            (writer.dir / "protocol.json").write_text(
                json.dumps(
                    {
                        "name": cfg.protocol,
                        "template": cfg.template,
                        "doc_style": cfg.doc_style,
                        "chat": cfg.chat,
                        "max_doc_chars": cfg.max_doc_chars,
                    }
                )
            )
            writer.metrics.update(_stats(rows, len(sources) - 1, resumed, time.time() - t0))
        journal.remove()
    return ctx.done(writer)


def _check(cfg: Config) -> None:
    if cfg.match not in ("exact", "cover"):
        raise UserError(f"synthesize.match: expected exact or cover, got {cfg.match!r}")
    if cfg.attempts < 1 or cfg.max_turns < 1:
        raise UserError("synthesize: attempts and max_turns must be at least 1")
    if cfg.teacher == "openai" and not (cfg.base_url and cfg.model):
        raise UserError(
            "synthesize: teacher=openai needs base_url and model (e.g. --set base_url=https://api."
            "deepseek.com --set model=deepseek-chat --set api_key_env=DEEPSEEK_API_KEY)"
        )
    if cfg.teacher == "hf" and not cfg.model:
        raise UserError("synthesize: teacher=hf needs model (an sft/rl artifact directory, a hub id or a path)")
    if cfg.judge and not ((cfg.judge_base_url or cfg.base_url) and (cfg.judge_model or cfg.model)):
        raise UserError("synthesize: judge=true needs an endpoint: judge_base_url and judge_model (or the teacher's)")
    if cfg.extra_worlds and not cfg.index:
        raise UserError(
            "synthesize.extra_worlds: needs the index artifact (its bm25 settings are reused per world); set index"
        )
    if cfg.extra_worlds and cfg.questions:
        raise UserError("synthesize.extra_worlds: adds synthetic-world questions; it cannot be combined with questions")
    _check_reader(cfg)


def _check_reader(cfg: Config) -> None:
    if cfg.reader == "none":
        return
    if cfg.teacher != "oracle" or cfg.template != "qa" or cfg.protocol != "search-r1":
        raise UserError(
            f"synthesize.reader={cfg.reader}: needs teacher=oracle, protocol=search-r1 and template=qa "
            f"(got teacher={cfg.teacher}, protocol={cfg.protocol}, template={cfg.template})"
        )
    if cfg.reader == "gold" and cfg.questions:
        raise UserError(
            "synthesize.reader=gold: needs the world's corpus for the gold documents; use the world's "
            "questions (split), not a questions file"
        )


def _sources(cfg: Config, inputs) -> list[tuple[str, list[dict], object]]:
    if "questions" in inputs:
        questions = load_questions(inputs["questions"].path, cfg.limit)
    else:
        questions = read_jsonl(
            inputs["world"].path / f"{cfg.split}.jsonl", required=("id", "question", "golden_answers")
        )
        questions = questions[: cfg.limit] if cfg.limit else questions
    for q in questions:
        q["id"] = str(q["id"])
    if cfg.reader == "gold":  # the gold documents stand in for the retriever (r3rag.data.gold)
        retriever = GoldRetriever(read_jsonl(inputs["world"].path / "corpus.jsonl"), questions)
    else:
        retriever = open_retriever(cfg.retriever, inputs.get("index"))
    sources = [("world" if "world" in inputs and not cfg.questions else "questions", questions, retriever)]
    if cfg.extra_worlds:
        sources += list(_extra_worlds(cfg, inputs))
    return sources


# ---------------------------------------------------------------- the attempt loop


def _synthesize(cfg: Config, ctx: Context, sources, protocol: Protocol, journal: Journal) -> None:
    total = sum(len(qs) for _, qs, _ in sources)
    with ctx.progress() as progress:
        task = progress.add_task("synthesize: questions", total=total, completed=len(journal.done))
        calls = progress.add_task("teacher requests", total=None) if cfg.teacher == "openai" else None
        if len(journal.done) >= total:  # a rerun after the last question was journaled
            return
        teacher = _teacher(cfg, protocol, on_result=lambda i, r: progress.advance(calls))
        judge = AnswerJudge(_judge_client(cfg, teacher)) if cfg.judge else None
        try:
            for source, qs, retriever in sources:
                todo = [q for q in qs if q["id"] not in journal.done]
                for lo in range(0, len(todo), cfg.batch_size):
                    for row in attempt_loop(todo[lo : lo + cfg.batch_size], teacher, retriever, protocol, cfg, judge):
                        journal.append({**row, "source": source})
                        progress.advance(task)
        finally:
            teacher.close()
            if judge is not None and judge.client is not teacher.client:
                judge.client.close()


def attempt_loop(batch: list[dict], teacher, retriever, protocol: Protocol, cfg: Config, judge=None):
    """Yield one finished row per question, as soon as it is accepted or out of attempts."""
    env_cfg = EnvConfig(
        mode=READER_MODES[cfg.reader],
        top_k=cfg.top_k,
        max_turns=cfg.max_turns,
        max_new_tokens=cfg.max_new_tokens,
        max_completion_tokens=max(1024, cfg.max_turns * (cfg.max_new_tokens + 512)),
    )
    pending, history = list(batch), {q["id"]: [] for q in batch}
    if teacher.name == "oracle":  # nothing to follow: rejected without an attempt
        for q in [q for q in pending if teachers.gold_kind(q) is None]:
            yield _rejected(
                q,
                [
                    {
                        "attempt": 1,
                        "temperature": 0.0,
                        "reason": "no_gold_chain",
                        "tokens_in": 0,
                        "tokens_out": 0,
                        "trajectory": None,
                    }
                ],
            )
        pending = [q for q in pending if teachers.gold_kind(q) is not None]
    n_attempts = 1 if teacher.deterministic else cfg.attempts
    for attempt in range(1, n_attempts + 1):
        if not pending:
            break
        temperature = 0.0 if attempt == 1 else cfg.temperature
        gen = teacher.generator(pending, temperature)
        trajs = run_rollouts(pending, gen, retriever, protocol, env_cfg, teacher.tokenizer)
        verdicts = _verdicts(trajs, pending, teacher, protocol, cfg, judge)
        still = []
        for traj, q, (ok, reason) in zip(trajs, pending, verdicts):
            tokens = teacher.usage(gen, traj)
            if ok:
                yield _accepted(traj, q, attempt, tokens, history[q["id"]])
            else:
                history[q["id"]].append(
                    {
                        "attempt": attempt,
                        "temperature": temperature,
                        "reason": reason,
                        "tokens_in": tokens[0],
                        "tokens_out": tokens[1],
                        "trajectory": traj.to_json(),
                    }
                )
                still.append(q)
        pending = still
    for q in pending:
        yield _rejected(q, history[q["id"]])


def _verdicts(trajs, questions, teacher, protocol: Protocol, cfg: Config, judge) -> list[tuple[bool, str]]:
    verdicts = []
    for traj, q in zip(trajs, questions):
        ok, reason = teachers.verify(traj, q, protocol, cfg.match)
        if ok and teacher.name == "oracle":
            ok, reason = teachers.verify_evidence(traj, q)
        verdicts.append((ok, reason))
    if judge is not None:  # ask the judge only about answers that did not match
        asks = [i for i, (ok, reason) in enumerate(verdicts) if reason == "wrong_answer"]
        said = judge.judge_many(
            [(questions[i]["question"], questions[i]["golden_answers"], trajs[i].answer) for i in asks], strict=False
        )
        for i, verdict in zip(asks, said):
            verdicts[i] = (True, "ok") if verdict else (False, "judge_error" if verdict is None else "judge_wrong")
    return verdicts


def _accepted(traj, q: dict, attempt: int, tokens: tuple[int, int], history: list[dict]) -> dict:
    return {
        **traj.to_json(),
        "golden_answers": q["golden_answers"],
        "metadata": _metadata(q),
        "status": "accepted",
        "attempt": attempt,
        "tokens_in": tokens[0] + sum(h["tokens_in"] for h in history),
        "tokens_out": tokens[1] + sum(h["tokens_out"] for h in history),
        "rejected_attempts": [
            {
                "attempt": h["attempt"],
                "reason": h["reason"],
                "answer": h["trajectory"]["answer"],
                "finish_reason": h["trajectory"]["finish_reason"],
            }
            for h in history
        ],
    }


def _rejected(q: dict, history: list[dict]) -> dict:
    return {
        "id": q["id"],
        "question": q["question"],
        "golden_answers": q["golden_answers"],
        "metadata": _metadata(q),
        "status": "rejected",
        "reject_reason": history[-1]["reason"],
        "tokens_in": sum(h["tokens_in"] for h in history),
        "tokens_out": sum(h["tokens_out"] for h in history),
        "attempts": history,
    }


def _metadata(q: dict) -> dict:
    # Context paragraphs are the corpus's business (and large); everything else is kept.
    return {k: v for k, v in (q.get("metadata") or {}).items() if k not in ("paragraphs", "context")}


def _public(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "status"}


def _teacher(cfg: Config, protocol: Protocol, on_result=None):
    match cfg.teacher:
        case "oracle" if cfg.reader != "none":
            return teachers.reader_teacher(protocol)
        case "oracle":
            return teachers.oracle_teacher(protocol)
        case "hf":
            return teachers.hf_teacher(cfg.model, cfg.gen_batch_size)
        case "openai":
            return teachers.endpoint_teacher(
                _client(cfg, cfg.base_url, cfg.model, cfg.api_key_env), protocol, on_result
            )


def _judge_client(cfg: Config, teacher):
    if not (cfg.judge_base_url or cfg.judge_model) and teacher.client is not None:
        return teacher.client
    return _client(
        cfg, cfg.judge_base_url or cfg.base_url, cfg.judge_model or cfg.model, cfg.judge_api_key_env or cfg.api_key_env
    )


def _client(cfg: Config, base_url: str, model: str, api_key_env: str):
    from r3rag.llm.openai_client import ChatClient

    return ChatClient(
        base_url,
        model,
        api_key_env=api_key_env,
        timeout=cfg.timeout,
        max_retries=cfg.max_retries,
        concurrency=cfg.concurrency,
        seed=cfg.seed,
    )


def _stats(rows: list[dict], n_extra: int, resumed: int, wall: float) -> dict:
    accepted = [r for r in rows if r["status"] == "accepted"]
    rejected = [r for r in rows if r["status"] == "rejected"]
    failed_attempts = [a["reason"] for r in rows for a in r.get("rejected_attempts", r.get("attempts", []))]
    attempts = [r["attempt"] for r in accepted] + [len(r["attempts"]) for r in rejected]

    def mean(xs):
        return round(sum(xs) / len(xs), 3) if xs else 0.0

    return {
        "questions": len(rows),
        "accepted": len(accepted),
        "rejected": len(rejected),
        "acceptance_rate": round(len(accepted) / len(rows), 4),
        "rejected_by_reason": dict(Counter(r["reject_reason"] for r in rejected)),
        "rejected_attempts_by_reason": dict(Counter(failed_attempts)),
        "attempts": sum(attempts),
        "attempts_per_question": mean(attempts),
        "accepted_at_attempt": {str(k): v for k, v in sorted(Counter(r["attempt"] for r in accepted).items())},
        "steps_per_trajectory": mean([sum(t["role"] == "model" for t in r["turns"]) for r in accepted]),
        "searches_per_trajectory": mean([len(r["retrieved"]) for r in accepted]),
        "tokens_in": sum(r["tokens_in"] for r in rows),
        "tokens_out": sum(r["tokens_out"] for r in rows),
        "wall_seconds": round(wall, 2),
        "resumed_questions": resumed,
        "extra_worlds": n_extra,
        "from_eval_world": sum(r.get("source") == "world" for r in accepted),
    }


def _extra_worlds(cfg: Config, inputs):
    """(source, questions, retriever) for freshly generated worlds, test entities excluded."""
    from r3rag.data.world import chain_names, fresh_world_config, generate_world, world_config_from
    from r3rag.retrieval.bm25 import BM25Retriever

    base = world_config_from(inputs["world"].manifest["config"])
    index_settings = json.loads((inputs["index"].path / "index" / "settings.json").read_text())
    if index_settings["backend"] != "bm25":
        raise UserError("synthesize.extra_worlds: needs a bm25 index (its settings are reused per world)")
    held_out = chain_names(_evaluated_questions(inputs["world"].path))
    rng = random.Random(cfg.seed)
    for i in range(cfg.extra_worlds):
        world = generate_world(fresh_world_config(base, i, cfg.extra_world_clusters))
        pool = [q for q in world.questions if not (chain_names([q]) & held_out)]
        qs = rng.sample(pool, min(cfg.extra_questions_per_world, len(pool)))
        for q in qs:
            q["id"] = f"w{i}-{q['id']}"
        if cfg.reader == "gold":
            retriever = GoldRetriever(world.docs, qs)
        else:
            retriever = BM25Retriever.build(
                world.docs,
                stopwords=index_settings["stopwords"],
                stemmer=index_settings["stemmer"],
                k1=index_settings["k1"],
                b=index_settings["b"],
                method=index_settings["method"],
            )
        yield f"extra{i}", qs, retriever


def _evaluated_questions(world_dir) -> list[dict]:
    """The evaluation world's test and dev questions: no training question may name their entities."""
    return [
        q
        for split in ("test", "dev")
        if (world_dir / f"{split}.jsonl").is_file()
        for q in read_jsonl(world_dir / f"{split}.jsonl", allow_empty=True)
    ]
