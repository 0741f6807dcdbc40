"""`r3rag eval`: EM/F1 of several systems on held-out questions, through the same rollout loop.

Systems (`systems`, evaluated in order):
- built-ins: `direct` (answer with no retrieval), `rag` (retrieve top-k with the question,
  answer once) — both run `baseline_policy` with the answer forced —, `sft` and `rl` (the
  trained policies, searching step by step);
- any name defined under `models` (see r3rag.evaluation.systems): a policy artifact, any transformers
  model (prompted, in its chat template), an OpenAI-compatible endpoint, or a scripted baseline.

Questions: the world artifact's `split`, or an imported file (`questions: path`, what
`r3rag import` writes; the world is then not needed). Retrievers: the index artifact (or a
`retriever` server URL), or several at once (`retrievers: [index:latest, runs/index/dense-..,
http://...]`: every system runs with every retriever, labelled `system@retriever` — the
retriever-transfer table). Sampling: `temperature` > 0 with `n_samples` draws (seeds seed,
seed+1, ...); EM/F1 then average over samples per question, and `em_any` is the share of
questions with at least one correct sample. `judge`: an LLM judge over an OpenAI-compatible
endpoint adds `judge_acc` (R3-RAG's metric).

Writes `predictions.jsonl`, `metrics.json` (`{"systems": {label: {"em", "f1", "n", "by_dataset",
...}}, "seconds": {stage: wall seconds}, "comparisons": [...]}`) and `table.md` (every system per
data set with 95% intervals; with `compare_to: [sft, rl]`, each system's EM difference from those
over the same questions, with a paired-bootstrap interval), and prints a table.

Resumable: each finished chunk of questions is journaled (r3rag.evaluation.resume); rerunning a killed
eval with the same settings generates only what is left, and writes what a straight run would.

Usage:

    r3rag eval --set limit=400
    r3rag eval --set systems='[sft]' --set rl=
    r3rag eval --set questions=data/hotpotqa_dev.jsonl --set index=runs/index/hotpot-abc --set world= \\
               --set 'systems=[top-title]' --set models.top-title.scripted=top-title
    r3rag eval --set 'retrievers=[index:latest,runs/index/dense-abc]' --set 'systems=[sft]'
    r3rag eval --set retriever=http://127.0.0.1:8000 --set index=    # search through a retrieval server
    r3rag eval --set 'systems=[rag3,rag5]' --set models.rag3.model=HuggingFaceTB/SmolLM2-135M-Instruct \\
               --set models.rag3.template=qa --set models.rag3.mode=rag --set models.rag3.top_k=3 ...
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from r3rag.core.artifacts import ArtifactRef, journal_file, resolve
from r3rag.core.env import EnvSettings, check_env_settings, run_rollouts
from r3rag.evaluation.judge import AnswerJudge, JudgeSpec
from r3rag.evaluation.predictions import print_table, stage_seconds, summarize, to_prediction
from r3rag.evaluation.resume import EvalChunks
from r3rag.evaluation.systems import System, SystemSpec, check_spec, is_policy_artifact, load_system, weights_source
from r3rag.evaluation.tables import comparison_table, dataset_table, paired_comparisons
from r3rag.generation.vllm import EnginePool, EngineSettings
from r3rag.retrieval import is_url, open_retriever
from r3rag.stages.common import (
    FILE,
    Context,
    QuestionSource,
    model_location,
    model_ref,
    resolve_inputs,
    set_threads,
)
from r3rag.util.config import unhashed
from r3rag.util.errors import UserError
from r3rag.util.journal import Journal
from r3rag.util.jsonl import read_jsonl, write_jsonl

INPUTS = {"world": "world", "questions": FILE, "index": "index", "sft": "sft", "rl": "rl"}
BUILTINS = {"direct": "direct", "rag": "rag", "gold": "gold", "sft": "iterative", "rl": "iterative"}


@dataclass
class Config(EnvSettings, QuestionSource):  # top_k, max_turns, max_new_tokens; world, questions, split, limit
    name: str = "default"  # the artifact's name: runs/eval/<name>-<hash>
    index: str = "index:latest"  # the index artifact systems search
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    retrievers: list[str] = field(default_factory=list)  # several (index refs or URLs): retriever transfer
    sft: str = "sft:latest"  # the policy artifact of the `sft` system ("" when there is none)
    rl: str = "rl:latest"  # "" when there is no RL policy
    systems: list[str] = field(default_factory=lambda: ["direct", "rag", "sft", "rl"])  # built-ins or `models`
    models: dict[str, SystemSpec] = field(default_factory=dict)  # more systems, by name
    baseline_policy: str = "sft"  # the model `direct` and `rag` use
    split: str = "test"  # held-out questions
    limit: int = 400
    batch_size: int = 128  # sequences per generate call; hashed: sampled draws depend on the batches
    # transformers systems: compiled static-cache decoding (GPUs); how to decode, not what is measured (same tokens)
    static_cache: bool = unhashed(False)
    # vllm: model systems use an in-process vLLM engine; auto: vLLM where it is installed and the eval is
    # large enough (AUTO_VLLM_QUESTIONS) to repay the engine's start, else transformers
    backend: Literal["transformers", "vllm", "auto"] = "transformers"
    # backend=vllm: the engine's size (how to run, not what is measured; see r3rag.generation.vllm.EngineSettings)
    vllm_max_model_len: int = unhashed(0)  # longest trajectory in tokens (0: the model's context length)
    vllm_gpu_memory: float = unhashed(0.9)  # on a GPU: the share of its memory the engine takes
    vllm_kv_cache_gb: float = unhashed(2.0)  # on the CPU: RAM for the engine's KV cache
    temperature: float = 0.0  # 0 = greedy
    n_samples: int = 1  # draws per question when sampling
    judge: JudgeSpec = field(default_factory=JudgeSpec)  # an LLM judge adding judge_acc (judge.endpoint "" = none)
    compare_to: list[str] = field(default_factory=list)  # systems every other one is compared with (paired bootstrap)
    threads: int = unhashed(0)  # CPU threads: how fast, not what is measured
    seed: int = 0  # sampling: draw i uses seed + i (temperature > 0)


def run(cfg: Config, ctx: Context):
    validate(cfg)
    specs = system_specs(cfg)
    inputs = resolve_inputs(cfg, needed_inputs(cfg, specs), ctx)
    # Built-ins name the sft/rl inputs, resolved (and content-hashed) above: not again here.
    resolved = {getattr(cfg, f): inputs[f] for f in ("sft", "rl") if f in inputs}
    policies = {
        label: resolved.get(s.model) or resolve_policy(s.model, ctx)
        for label, s in specs.items()
        if s.model and not s.endpoint and is_policy_artifact(s.model)
    }
    retrievers = retriever_refs(cfg, inputs, ctx)
    imported = model_artifacts(specs, ctx)  # `model: model:latest`: load its model/, hash its content
    specs = {
        label: dataclasses.replace(s, model=model_location(s.model, {"model": imported[label]}))
        if label in imported
        else s
        for label, s in specs.items()
    }
    all_inputs = {
        **inputs,
        **{f"model:{k}": v for k, v in {**policies, **imported}.items() if k not in BUILTINS},
        **{f"retriever:{k}": v for k, v in retrievers.items() if isinstance(v, ArtifactRef)},
    }
    writer = ctx.writer("eval", cfg, all_inputs, INPUTS)
    if writer.existing:
        print_table(json.loads((writer.existing.path / "metrics.json").read_text()), ctx.console)
        return ctx.skipped(writer)
    set_threads(cfg.threads)
    questions = cfg.read_questions(inputs)
    judge = AnswerJudge.from_spec(cfg.judge, "eval.judge") if cfg.judge.endpoint else None
    backend = resolve_backend(cfg, specs, policies, len(questions))
    check_vllm_weights(backend, specs, policies)
    engines = EnginePool(EngineSettings(cfg.vllm_max_model_len, cfg.vllm_gpu_memory, cfg.vllm_kv_cache_gb))
    with Journal(journal_file(writer.final)) as journal, writer:
        t0, chunks = time.time(), EvalChunks(journal)
        results, predictions = {}, []
        for label, spec in specs.items():
            system = load_system(
                label,
                spec,
                policies[label].path if label in policies else None,
                cfg.batch_size,
                cfg.static_cache,
                backend,
                engines,
            )
            for r_label, r_ref in (retrievers if system.mode != "gold" else {"": None}).items():
                name = f"{label}@{r_label}" if len(retrievers) > 1 and system.mode != "gold" else label
                retriever = (
                    None
                    if system.mode == "direct"
                    else gold_retriever(inputs, questions)
                    if system.mode == "gold"
                    else _open(r_ref)
                )
                rows, seconds = evaluate_system(system, questions, retriever, cfg, ctx, name, chunks)
                if judge is not None:
                    for row, ok in zip(
                        rows, judge.judge_many([(r["question"], r["golden_answers"], r["answer"]) for r in rows])
                    ):
                        row["judge"] = ok
                results[name] = {
                    **summarize(rows),
                    "seconds": round(seconds, 2),
                    "questions_per_s": round(len(questions) / seconds, 2) if seconds else None,
                }
                predictions.extend(rows)
        write_jsonl(writer.dir / "predictions.jsonl", predictions)
        seconds = stage_seconds(inputs)
        seconds["eval"] = round(time.time() - t0, 1)
        metrics = {"systems": results, "seconds": seconds, "dataset": dataset_name(cfg, inputs)}
        if cfg.backend == "auto":  # which one auto chose (a named backend is in the config)
            metrics["backend"] = backend
        metrics["comparisons"] = paired_comparisons(predictions, cfg.compare_to)
        (writer.dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        (writer.dir / "table.md").write_text(dataset_table(results) + "\n" + comparison_table(metrics["comparisons"]))
        writer.metrics.update({s: {"em": m["em"], "f1": m["f1"], "n": m["n"]} for s, m in results.items()})
        print_table(metrics, ctx.console)
    journal.remove()  # the artifact is committed: nothing left to resume
    return ctx.done(writer)


def validate(cfg: Config) -> None:
    """Checks a dry run can make without loading anything."""
    system_specs(cfg)
    if cfg.n_samples < 1:
        raise UserError("eval.n_samples: must be at least 1")
    check_env_settings(cfg, "eval")


def model_artifacts(specs: dict[str, SystemSpec], ctx: Context) -> dict[str, ArtifactRef]:
    """The systems whose `model` names a `model` artifact (r3rag import-model), resolved."""
    names = {s.model for s in specs.values() if s.model and not s.endpoint}
    resolved = {name: model_ref(name, ctx) for name in names}  # once per name: resolving hashes the weights
    return {
        label: resolved[s.model]
        for label, s in specs.items()
        if s.model in resolved and resolved[s.model] is not None and not s.endpoint
    }


AUTO_VLLM_QUESTIONS = 100  # backend=auto: the fewest questions for which vLLM's engine start pays back


def resolve_backend(cfg: Config, specs: dict[str, SystemSpec], policies: dict, n_questions: int) -> str:
    """The backend the model systems run on: `cfg.backend`, or for `auto` vLLM where it is installed,
    the eval has at least AUTO_VLLM_QUESTIONS questions and its model systems share one set of
    weights (one engine), else transformers. The manifest's metrics.json records which."""
    if cfg.backend != "auto":
        return cfg.backend
    import importlib.util

    weights = _model_weights(specs, policies)
    if importlib.util.find_spec("vllm") is None or not weights or n_questions < AUTO_VLLM_QUESTIONS:
        return "transformers"
    return "vllm" if len(set(weights.values())) == 1 else "transformers"


def _model_weights(specs: dict[str, SystemSpec], policies: dict) -> dict:
    return {
        label: weights_source(spec, policies[label].path if label in policies else None)
        for label, spec in specs.items()
        if not spec.endpoint and not spec.scripted
    }


def check_vllm_weights(backend: str, specs: dict[str, SystemSpec], policies: dict) -> None:
    """`backend: vllm` runs one set of weights per eval: a vLLM engine takes most of the GPU's memory."""
    if backend != "vllm":
        return
    weights = _model_weights(specs, policies)
    if len(set(weights.values())) > 1:
        raise UserError(
            f"eval.backend=vllm: one set of weights per eval (each vLLM engine takes most of the GPU); "
            f"these systems use {len(set(weights.values()))}: {', '.join(weights)}. "
            "Run one eval per model (e.g. systems=[rl]), or backend=transformers"
        )


def system_specs(cfg: Config) -> dict[str, SystemSpec]:
    """Every system to run, as a spec; built-ins point at the sft/rl inputs."""
    specs = {}
    for name in cfg.systems:
        if name in cfg.models:
            check_spec(name, cfg.models[name])
            specs[name] = cfg.models[name]
        elif name in BUILTINS:
            policy = name if BUILTINS[name] == "iterative" else cfg.baseline_policy
            if policy not in ("sft", "rl"):
                raise UserError(f"eval.baseline_policy: expected sft or rl, got {policy!r}")
            if not getattr(cfg, policy):
                raise UserError(f"eval: system {name!r} needs input {policy!r}, which is empty")
            specs[name] = SystemSpec(model=getattr(cfg, policy), mode=BUILTINS[name])
        else:
            known = list(BUILTINS) + list(cfg.models)
            raise UserError(
                f"eval.systems: unknown system {name!r} (available: {', '.join(known)}; define more under eval.models)"
            )
    unused = sorted(set(cfg.models) - set(cfg.systems))
    if unused:
        raise UserError(f"eval.models: {unused[0]!r} is defined but not listed in eval.systems")
    return specs


def needed_inputs(cfg: Config, specs: dict[str, SystemSpec]) -> dict[str, str]:
    needed = {"questions"} if cfg.questions else {"world"}
    needed |= {
        name
        for name in ("sft", "rl")
        if any(s.model == getattr(cfg, name) and getattr(cfg, name) for s in specs.values())
    }
    if any(s.mode == "gold" for s in specs.values()) and "world" not in needed:
        raise UserError("eval: mode gold reads the gold documents from the world's corpus; use the world's questions")
    if not cfg.retrievers and not is_url(cfg.retriever) and any(s.mode in ("rag", "iterative") for s in specs.values()):
        needed.add("index")
    for f in needed:
        if not getattr(cfg, f):
            raise UserError(f"eval: needs input {f!r}, which is empty")
    return {k: v for k, v in INPUTS.items() if k in needed}


def retriever_refs(cfg: Config, inputs: dict, ctx: Context) -> dict[str, ArtifactRef | str | None]:
    """label -> an index artifact or a server URL (one entry, labelled "", without `retrievers`)."""
    if not cfg.retrievers:
        return {"": cfg.retriever if is_url(cfg.retriever) else inputs.get("index")}
    out: dict[str, ArtifactRef | str] = {}
    for ref in cfg.retrievers:
        target = ref if is_url(ref) else resolve(ref, "index", ctx.runs_dir)
        label = ref if is_url(ref) else _index_label(target)
        while label in out:
            label += "'"
        out[label] = target
    return out


def _index_label(ref: ArtifactRef) -> str:
    backend = ref.manifest.get("config", {}).get("backend", "index")
    name = ref.manifest.get("config", {}).get("name", "default")
    return backend if name in ("default", backend) else f"{backend}:{name}"


def _open(ref):
    if isinstance(ref, str):
        return open_retriever(ref)
    return open_retriever(None, ref)


def resolve_policy(ref: str, ctx: Context) -> ArtifactRef:
    """`sft:latest`, `rl:<id>` or the directory of an sft/rl artifact."""
    if ":" in ref and not Path(ref).exists():
        return resolve(ref, ref.split(":")[0], ctx.runs_dir)
    manifest = Path(ref) / "manifest.json"
    stage = json.loads(manifest.read_text()).get("stage") if manifest.is_file() else None
    if stage not in ("sft", "rl"):
        raise UserError(f"input {ref!r}: not an sft or rl policy artifact")
    return resolve(ref, stage, ctx.runs_dir)


def evaluate_system(
    system: System, questions: list[dict], retriever, cfg: Config, ctx: Context, label: str, chunks: EvalChunks
) -> tuple[list[dict], float]:
    """Prediction rows (one per question and sample) and the seconds they took (every leg of a
    resumed eval). Each finished chunk is journaled (r3rag.evaluation.resume): a killed eval resumes."""
    mode = "rag" if system.mode == "gold" else system.mode  # the gold retriever stands in for the search
    env_cfg = cfg.env_config(mode, top_k=system.top_k)  # a system's own depth (rag3, rag5) wins over eval's
    n_samples = cfg.n_samples if cfg.temperature > 0 else 1
    rows, seconds, chunk = [], 0.0, cfg.batch_size * 4
    with ctx.progress() as progress:
        task = progress.add_task(f"eval: {label}", total=len(questions) * n_samples, unit="questions")
        for sample in range(n_samples):
            gen = system.make_generator(cfg.temperature, cfg.seed + sample)
            for lo in range(0, len(questions), chunk):
                batch = questions[lo : lo + chunk]
                hi = lo + len(batch)
                done = chunks.done(label, sample, lo, hi)
                if done is None:
                    t0, before = time.perf_counter(), len(rows)
                    # a chunk's questions count as their trajectories finish, turn by turn
                    trajs = run_rollouts(
                        batch,
                        gen,
                        retriever,
                        system.protocol,
                        env_cfg,
                        system.tokenizer,
                        on_turn=lambda finished, _, before=before: progress.update(task, before + finished),
                    )
                    new = [to_prediction(label, t, q, sample) for t, q in zip(trajs, batch)]
                    done = {"rows": new, "seconds": time.perf_counter() - t0}
                    chunks.record(label, sample, lo, hi, new, done["seconds"], sampled=cfg.temperature > 0)
                    progress.update(task, before + len(batch))  # those cut at max_turns too
                else:
                    progress.skip(task, len(batch))  # journaled by a killed run: counted, not timed
                rows += done["rows"]
                seconds += done["seconds"]
    return rows, seconds


def gold_retriever(inputs: dict, questions: list[dict]):
    """The questions' gold documents from the world's corpus, served for their text (r3rag.data.gold)."""
    from r3rag.data.gold import GoldRetriever

    return GoldRetriever(read_jsonl(inputs["world"].path / "corpus.jsonl"), questions)


def dataset_name(cfg: Config, inputs: dict) -> str:
    if "questions" in inputs:
        return Path(cfg.questions).stem
    return f"{inputs['world'].id}:{cfg.split}"
