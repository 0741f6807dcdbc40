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
goes to `rejected.jsonl` with every attempt and its reason. `keep: all` (rejection-sampling
fine-tuning, with `teacher: hf` and a policy) samples all `attempts` at `temperature`, none greedy,
and keeps every distinct accepted one (`<id>#<k>`; the manifest counts `duplicate_trajectories`).
A request that fails after its retries rejects that attempt (`teacher_error:<kind>`), not the run.
The loop itself is r3rag.synthesis.attempts; this module resolves the inputs, builds the teacher and writes
the artifact.

Resumable: each finished question is appended (fsynced within a second) to `runs/synthesize/.journal-<id>.jsonl`;
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
    r3rag synthesize --set teacher=hf --set model=runs/sft/<id> --set attempts=8 --set temperature=0.3 \\
        --set keep=all   # rejection sampling from a policy: 8 sampled attempts per question, every correct one
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

from r3rag.core.artifacts import journal_file
from r3rag.core.protocol import Protocol, ProtocolSettings
from r3rag.data.gold import GoldRetriever
from r3rag.evaluation.judge import AnswerJudge
from r3rag.retrieval import is_url, open_retriever
from r3rag.stages.common import (
    FILE,
    Context,
    QuestionSource,
    add_model_input,
    model_location,
    of_types,
    resolve_inputs,
    set_threads,
)
from r3rag.synthesis import teachers
from r3rag.synthesis.attempts import AttemptSettings, attempt_loop, public_row, summarize_rows, trajectory_rows
from r3rag.util.config import unhashed
from r3rag.util.errors import UserError
from r3rag.util.journal import Journal
from r3rag.util.jsonl import read_jsonl, write_jsonl

INPUTS = {"world": "world", "index": "index", "questions": FILE}


@dataclass
class Config(
    AttemptSettings, QuestionSource, ProtocolSettings
):  # the shared keys: r3rag.synthesis.attempts, common, protocol
    name: str = "default"  # the artifact's name: runs/synthesize/<name>-<hash>
    index: str = "index:latest"  # the index artifact the teacher searches
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    extra_worlds: int = 0  # freshly generated worlds whose questions add training data (0 = none)
    extra_questions_per_world: int = 400  # questions drawn from each extra world
    extra_world_clusters: int = 10  # size of each extra world; 0 = same as the evaluation world
    teacher: Literal["oracle", "openai", "hf"] = "oracle"  # gold-chain script, an endpoint, or a local model
    judge: bool = False  # an LLM judge decides answers that do not match
    base_url: str = ""  # openai teacher: e.g. https://api.deepseek.com or http://127.0.0.1:8000/v1
    model: str = ""  # openai: the served model name; hf: artifact dir, hub id or path
    api_key_env: str = ""  # name of the environment variable holding the key ("" = none)
    judge_base_url: str = ""  # "" = the teacher's endpoint
    judge_model: str = ""  # "" = the teacher's model
    judge_api_key_env: str = ""  # "" = the teacher's api_key_env
    # How fast a run goes, not what it writes: kept out of the artifact id, so a rerun with other
    # values still resumes the same journal.
    concurrency: int = unhashed(32)
    timeout: float = unhashed(60.0)  # seconds one try of an endpoint request may take
    max_retries: int = unhashed(5)  # retries of a failed endpoint request (429, 5xx, timeouts)
    batch_size: int = unhashed(1024)  # questions per rollout batch
    gen_batch_size: int = unhashed(64)  # hf teacher: sequences per generate call
    threads: int = unhashed(0)  # CPU threads for torch (0 = torch's default)
    seed: int = 0  # sampled attempts, extra worlds' questions, the order of trajectories.jsonl


def run(cfg: Config, ctx: Context):
    _check(cfg)
    remote = is_url(cfg.retriever) and not cfg.extra_worlds  # the index is then not used at all
    fields = {
        k: v
        for k, v in INPUTS.items()
        if not (remote and k == "index") and not (k == "world" and cfg.questions and not cfg.extra_worlds)
    }
    inputs = resolve_inputs(cfg, fields, ctx)
    fields = add_model_input(cfg.model, inputs, INPUTS, ctx) if cfg.teacher == "hf" else INPUTS
    writer = ctx.writer("synthesize", cfg, inputs, fields)
    if writer.existing:
        return ctx.skipped(writer)
    cfg = dataclasses.replace(cfg, model=model_location(cfg.model, inputs))  # the hf teacher loads this
    set_threads(cfg.threads)
    sources = _sources(cfg, inputs)
    protocol = cfg.to_protocol()
    t0 = time.time()
    with Journal(journal_file(writer.final)) as journal:
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
            writer.started = t0  # the manifest's seconds cover the teacher's work, not only the publishing
            order = {q["id"]: i for i, q in enumerate(q for _, qs, _ in sources for q in qs)}
            rows = sorted(rows, key=lambda r: order.get(r["id"], len(order)))  # the same files after a resume
            accepted = [t for r in rows if r["status"] == "accepted" for t in trajectory_rows(r)]
            random.Random(cfg.seed).shuffle(accepted)
            write_jsonl(writer.dir / "trajectories.jsonl", accepted)
            write_jsonl(writer.dir / "rejected.jsonl", [public_row(r) for r in rows if r["status"] == "rejected"])
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
            writer.metrics.update(summarize_rows(rows, len(sources) - 1, resumed, time.time() - t0))
        journal.remove()
    return ctx.done(writer)


def _check(cfg: Config) -> None:
    if cfg.attempts < 1 or cfg.max_turns < 1:
        raise UserError("synthesize: attempts and max_turns must be at least 1")
    from r3rag.core.env import check_env_settings

    check_env_settings(cfg, "synthesize")
    if cfg.max_context_tokens and cfg.teacher != "hf":  # the budget counts a policy's tokens
        raise UserError(
            f"synthesize.max_context_tokens: counts the policy's tokens, and the {cfg.teacher} teacher has no "
            "tokenizer (teacher=hf has); bound the cold start's rows with sft.max_length instead"
        )
    if cfg.teacher == "openai" and not (cfg.base_url and cfg.model):
        raise UserError(
            "synthesize: teacher=openai needs base_url and model (e.g. --set base_url=https://api."
            "deepseek.com --set model=deepseek-chat --set api_key_env=DEEPSEEK_API_KEY)"
        )
    if cfg.keep == "all" and cfg.teacher == "oracle":
        raise UserError(
            "synthesize.keep=all: samples a group per question; the oracle writes one trajectory per question "
            "(use teacher=hf with a policy, or openai)"
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
    questions = cfg.read_questions(inputs)
    if cfg.reader == "gold":  # the gold documents stand in for the retriever (r3rag.data.gold)
        retriever = GoldRetriever(read_jsonl(inputs["world"].path / "corpus.jsonl"), questions)
    else:
        retriever = open_retriever(cfg.retriever, inputs.get("index"))
    sources = [("world" if "world" in inputs and not cfg.questions else "questions", questions, retriever)]
    if cfg.extra_worlds:
        sources += list(_extra_worlds(cfg, inputs))
    return sources


# ---------------------------------------------------------------- driving the attempt loop (r3rag.synthesis.attempts)


def _synthesize(cfg: Config, ctx: Context, sources, protocol: Protocol, journal: Journal) -> None:
    total = sum(len(qs) for _, qs, _ in sources)
    with ctx.progress() as progress:
        # journaled questions (a killed run's) count as done, not in the rate
        task = progress.add_task("synthesize:", total=total, completed=len(journal.done), unit="questions")
        calls = progress.add_task("synthesize:", unit="teacher requests") if cfg.teacher == "openai" else None
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


def _teacher(cfg: Config, protocol: Protocol, on_result=None):
    match cfg.teacher:
        case "oracle" if cfg.reader != "none":
            return teachers.reader_teacher(protocol)
        case "oracle":
            return teachers.oracle_teacher(protocol)
        case "hf":
            import torch

            torch.manual_seed(cfg.seed)  # the sampled attempts follow the seed (RFT's groups, seed by seed)
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
    from r3rag.generation.endpoint import EndpointSettings  # the one place a client is built for endpoint settings

    endpoint = EndpointSettings(endpoint=base_url, model=model, api_key_env=api_key_env)
    options = {"timeout": cfg.timeout, "max_retries": cfg.max_retries, "concurrency": cfg.concurrency}
    return endpoint.client("synthesize", "for the teacher or judge", seed=cfg.seed, **options)


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
        pool = of_types([q for q in world.questions if not (chain_names([q]) & held_out)], cfg.types, f"world {i}")
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
