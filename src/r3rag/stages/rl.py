"""`r3rag rl`: GRPO (or PPO with a critic, RLOO, REINFORCE++: `algorithm`, r3rag.rl.ppo) with
TRL's GRPOTrainer and a multi-turn `rollout_func`.

Each process rolls out its share of every step's prompts through the environment loop
(generate until `</search>`/`</answer>`, retrieve, append the documents...) and returns
`env_mask`, so retrieved tokens get no loss. The reward is a weighted sum of named
components (em, f1, cover, format, search_r1_format, judge, relevance, r3rag: see
`r3rag.rl.rewards` for the formulas); every component is logged each step, weight 0 = logged
only. Starts from an SFT policy artifact, an RL one (`policy=rl:<id>` or its directory: a run
continued from another's published policy, as a long run's links are), or from any transformers
model (`model=`, the Search-R1 recipe: RL from a base model). The GRPO, rollout, dev-evaluation and checkpoint
settings are typed in r3rag.rl.settings (`GRPOSettings`, which Config extends), beside the
code that builds the trainer; the questions' keys (world, questions, split, limit) are the
`QuestionSource` every stage shares.

Against flat or collapsing GRPO (each off by default; the seed papers' recipes in pipelines/):
a small KL term (`beta`, 0.001 in Search-R1 and DeepSeek-R1), clip-higher (`epsilon_high`,
DAPO: 0.28), Dr. GRPO (`loss_type=dr_grpo` with `scale_rewards=none`), DAPO's dynamic sampling
(`dynamic_sampling`: groups whose rollouts all score the same are replaced by fresh questions,
at most `dynamic_sampling_rounds` refills a step), and per-step credit for the process reward
(`process_credit=step`: each search step's relevance reward goes to that step's tokens instead
of being folded into the trajectory's number; see `r3rag.rl.rewards` and `r3rag.training.trainers`).

Dev evaluation: `eval_every=N` answers `eval_limit` dev questions greedily (the world's
`dev.jsonl`, or `eval_questions`; only those of `types` where it is set, as the training
questions) before training, every N steps and at the last, through the
same env loop; `dev/em` and `dev/f1` go into that step's metrics.jsonl line beside the
training reward. `keep=best_dev` publishes the best step's weights instead of the last; the
manifest records `kept_step` and `kept_dev_em` either way.

Checkpoints go to `runs/rl/.work-<id>/` every `save_steps`; after a crash or a kill, rerunning
with the same settings continues from the last one (`resume=auto`, the default; `--resume`
insists on one, `resume=false` starts afresh). The artifact holds the
policy (`model/`, merged when trained with LoRA), `metrics.jsonl` (one line per step),
`rollouts.jsonl` (a sample per step and process), `reward_curves.png`.

Usage:

    r3rag rl --set steps=30 --set num_generations=8 --set rewards='{em: 1.0, format: 0.1}'
    r3rag rl --set rewards='{r3rag: 1.0, em: 0}' --set reward.relevance=embedding
    r3rag rl --set retriever=http://127.0.0.1:8000 --set index=    # search through a retrieval server
    r3rag rl --set algorithm=ppo --set kl_coef=0.001 --set critic_lr=1e-5   # PPO with a learned critic
    r3rag rl --resume                                               # continue a killed run
    r3rag rl --set eval_every=10 --set keep=best_dev                # publish the best step on dev
    r3rag rl --set dynamic_sampling=true --set epsilon_high=0.28 --set beta=0.001
    accelerate launch --config_file pipelines/accelerate/cpu-2proc.yaml -m r3rag.cli rl --set steps=4
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from r3rag.core.artifacts import ArtifactRef, load_manifest, work_dir
from r3rag.core.protocol import DocStyle, Protocol, Template
from r3rag.retrieval import is_url, open_retriever
from r3rag.rl.rewards import RewardSettings
from r3rag.rl.settings import GRPOSettings, check_settings
from r3rag.stages.common import (
    FILE,
    Context,
    QuestionSource,
    add_model_input,
    load_questions,
    model_location,
    of_types,
    process_state,
    resolve_inputs,
    set_threads,
)
from r3rag.training.checkpoints import prepare_work, step_of
from r3rag.training.helpers import LoraSettings, load_protocol_dict, save_policy
from r3rag.util.config import unhashed
from r3rag.util.errors import UserError
from r3rag.util.jsonl import read_jsonl

INPUTS = {"policy": "sft", "world": "world", "index": "index", "questions": FILE, "eval_questions": FILE}


@dataclass
class Config(GRPOSettings, QuestionSource):  # r3rag.rl.settings; world, questions, split, limit: QuestionSource
    name: str = "default"  # the artifact's name: runs/rl/<name>-<hash>
    policy: str = "sft:latest"  # the policy artifact (sft or rl) to start from, unless `model` is set
    model: str = ""  # start from this transformers model (id or path) instead of a policy artifact
    template: Template = "search-r1"  # the protocol when starting from `model`: prompt,
    doc_style: DocStyle = "search-r1"  # document rendering,
    chat: bool = False  # and the tokenizer's chat template around the prompt (instruct models)
    max_doc_chars: int | None = None  # document truncation (characters); None = as the policy was trained
    index: str = "index:latest"  # the index artifact rollouts search
    retriever: str = ""  # a retrieval server URL (http://...) to search instead of the index
    # rewards
    rewards: dict = field(default_factory=lambda: {"em": 1.0, "format": 0.0})  # component -> weight
    reward: RewardSettings = field(default_factory=RewardSettings)  # how components are computed (r3rag.rl.rewards)
    # model
    lora: bool = False
    lora_settings: LoraSettings = field(default_factory=LoraSettings)  # lora=true: the adapters' shape
    eval_questions: str = ""  # dev questions for eval_every: a question JSONL file; "" = the world's dev.jsonl
    # observe and resume (resume and threads: how to run, not what is trained)
    # auto: a rerun after a kill continues from the last checkpoint where there is one (the same settings
    # give the same artifact id, so only the killed run's own checkpoints); true: continue, an error
    # without one; false: start afresh, the killed run's checkpoints deleted
    resume: bool | Literal["auto"] = unhashed("auto")
    rollout_samples: int = 4  # trajectories saved per step and process to rollouts.jsonl
    threads: int = unhashed(0)  # CPU threads for torch (0 = torch's default)


def policy_stage(ref: str) -> str:
    """The stage the starting policy comes from: `rl` for an RL artifact (`rl:latest`, `rl:<id>` or
    its directory: a run continued from where another ended, as a long run's links are), else `sft`."""
    if ref.startswith("rl:") and not Path(ref).exists():
        return "rl"
    if Path(ref).is_dir() and (load_manifest(Path(ref)) or {}).get("stage") == "rl":
        return "rl"
    return "sft"


def validate(cfg: Config) -> None:
    check_settings(cfg)


def run(cfg: Config, ctx: Context):
    validate(cfg)
    skip = {"index"} if is_url(cfg.retriever) else set()
    skip |= {"policy"} if cfg.model else set()
    skip |= {"world"} if cfg.questions else set()
    fields = {**INPUTS, "policy": policy_stage(cfg.policy)}
    inputs = resolve_inputs(cfg, {k: v for k, v in fields.items() if k not in skip}, ctx)
    writer = ctx.writer("rl", cfg, inputs, add_model_input(cfg.model, inputs, fields, ctx))
    if writer.existing:
        return ctx.skipped(writer)
    cfg = dataclasses.replace(cfg, model=model_location(cfg.model, inputs))  # a model artifact's model/
    set_threads(cfg.threads)
    from r3rag.rl.grpo import resolve_vllm

    backend = resolve_vllm(cfg.vllm)  # a clear error before any work when vLLM is asked for and missing
    state = process_state()
    dev = _dev_questions(cfg, inputs)  # a missing dev split fails before any work
    work = work_dir(writer.final)
    resume_from = _prepare_work(work, cfg.resume, state)
    model, tokenizer, protocol_dict, base = _start(cfg, inputs)
    questions = cfg.read_questions(inputs)
    if state.is_main_process:
        algorithm = "" if cfg.algorithm == "grpo" else f"{cfg.algorithm}, "
        ctx.console.print(f"rl: {algorithm}rollouts with {f'vLLM ({backend})' if backend else 'transformers'}")
    from r3rag.training.observe import TrainClock

    clock = TrainClock(resume_from, work / "metrics.jsonl")  # seconds survive a resume
    trainer = _trainer(cfg, model, tokenizer, protocol_dict, questions, dev, inputs, work, state.process_index)
    trainer.add_callback(clock)
    with _server_guard(backend, cfg.vllm_server_url):
        trainer.train(resume_from_checkpoint=resume_from)
    trainer.save_model(str(work / "final"))  # on every rank: gathers ZeRO-3 / FSDP shards
    if not state.is_main_process:
        state.wait_for_everyone()  # the main process publishes
        return ArtifactRef("rl", writer.id, writer.final, load_manifest(writer.final) or {})
    with writer:
        writer.started = time.time() - clock.seconds()  # `seconds`: all training, every leg of a resumed run
        kept = _kept(cfg, work, trainer.state.global_step)
        _publish(work, kept["source"], writer.dir, tokenizer, protocol_dict, base, cfg)
        writer.metrics.update(summarize(read_jsonl(writer.dir / "metrics.jsonl", allow_empty=True)))
        writer.metrics.update(
            {
                "train_seconds": round(clock.seconds(), 1),
                "train_seconds_before_resume": round(clock.before, 1),
                "processes": state.num_processes,
                "resumed_from_step": step_of(resume_from),
            }
        )
        writer.metrics.update({k: v for k, v in kept.items() if k != "source"})
    shutil.rmtree(work, ignore_errors=True)
    state.wait_for_everyone()
    return ctx.done(writer)


def _prepare_work(work: Path, resume: bool | str, state) -> str | None:
    """The run's working directory (checkpoints, logs), kept across kills for --resume; on resume
    the lines logged after the checkpoint are dropped (those steps are run and logged again)."""
    from r3rag.training.observe import truncate_after

    def trim_logs(step: int) -> None:
        for path in [work / "metrics.jsonl", *work.glob("rollouts.rank*.jsonl")]:
            truncate_after(path, step)

    return prepare_work(work, resume, "rl", state, trim_logs)


def _start(cfg: Config, inputs):
    """The starting policy: an SFT artifact (protocol from its policy.json) or a model id/path."""
    from r3rag.training.modeling import load_model, load_policy, load_tokenizer

    if cfg.model:
        model, tokenizer = load_model(cfg.model), load_tokenizer(cfg.model)
        protocol_dict = {"name": "search-r1", "template": cfg.template, "doc_style": cfg.doc_style, "chat": cfg.chat}
        base = cfg.model
    else:
        model, tokenizer = load_policy(inputs["policy"].path)
        protocol_dict = load_protocol_dict(inputs["policy"].path)
        base = str(inputs["policy"].path)
    if cfg.max_doc_chars is not None:
        protocol_dict = {**protocol_dict, "max_doc_chars": cfg.max_doc_chars}
    from r3rag.training.helpers import require_chat_template

    require_chat_template(Protocol(**protocol_dict), tokenizer, "rl")  # also fails early on a bad template
    if cfg.lora:
        from transformers import set_seed

        from r3rag.training.helpers import apply_lora

        set_seed(cfg.seed)  # LoRA's random init is the run's (the Trainer seeds only once it is built)
        model = apply_lora(model, cfg.lora_settings)
    return model, tokenizer, protocol_dict, base


def _dev_questions(cfg: Config, inputs) -> list[dict]:
    """The questions `eval_every` evaluates on: `eval_questions`, else the world's dev.jsonl; of
    `types` where it is set, as the training questions are."""
    if not cfg.eval_every:
        return []
    if "eval_questions" in inputs:
        path = inputs["eval_questions"].path
        questions = of_types(load_questions(path, limit=0 if cfg.types else cfg.eval_limit), cfg.types, str(path))
        return questions[: cfg.eval_limit] if cfg.eval_limit else questions
    path = inputs["world"].path / "dev.jsonl" if "world" in inputs else None
    if path is None or not path.is_file():
        where = (
            f"the world artifact {inputs['world'].path} has no dev.jsonl" if path else "rl.questions gives no dev split"
        )
        raise UserError(f"rl.eval_every: {where}; set rl.eval_questions to a question JSONL file (or eval_every=0)")
    questions = of_types(read_jsonl(path, required=("id", "question", "golden_answers")), cfg.types, str(path))
    return questions[: cfg.eval_limit] if cfg.eval_limit else questions


def _server_guard(backend: str, url: str):
    """rl.vllm=server: a server lost mid-run is one line (the checkpoints stay for --resume)."""
    if backend != "server":
        return contextlib.nullcontext()
    from r3rag.generation.vllm_server import server_lost

    return server_lost(url)


def _trainer(cfg: Config, model, tokenizer, protocol_dict, questions, dev, inputs, work: Path, rank: int):
    from r3rag.rl.grpo import build_trainer
    from r3rag.rl.rewards import RewardScorer
    from r3rag.training.observe import MetricsLog, RolloutSampler, show_progress

    protocol = Protocol(**protocol_dict)
    scorer = RewardScorer(cfg.rewards, cfg.reward, protocol, step_credit=cfg.process_credit == "step")
    retriever = open_retriever(cfg.retriever, inputs.get("index"))
    sampler = RolloutSampler(work / f"rollouts.rank{rank}.jsonl", cfg.rollout_samples, rank)
    trainer = build_trainer(
        model,
        tokenizer,
        questions,
        retriever,
        protocol,
        scorer,
        cfg,
        work,
        callbacks=[MetricsLog(work / "metrics.jsonl")],
        sampler=sampler,
        dev_questions=dev,
    )
    return show_progress(trainer, "rl")


def _kept(cfg: Config, work: Path, last_step: int) -> dict:
    """Which weights to publish (`source`) and what the manifest says about them: the step kept and
    its dev EM, the dev EM before training and the best step's (when dev was evaluated)."""
    dev_file = work / "dev.json"
    record = json.loads(dev_file.read_text()) if dev_file.is_file() else {}
    if not record:
        return {"source": work / "final", "kept_step": last_step}
    best, last = record["best"], record["last"]
    kept = best if cfg.keep == "best_dev" else last
    source = work / f"best-{best['step']}" if cfg.keep == "best_dev" else work / "final"
    return {
        "source": source,
        "kept_step": kept["step"],
        "kept_dev_em": kept["dev/em"],
        "start_dev_em": record.get("start", {}).get("dev/em"),
        "best_dev_step": best["step"],
        "best_dev_em": best["dev/em"],
    }


def _publish(work: Path, final: Path, out: Path, tokenizer, protocol_dict: dict, base: str, cfg: Config) -> None:
    """Policy `final` (the last step's or the best on dev; LoRA merged), metrics.jsonl,
    rollouts.jsonl and reward_curves.png into the artifact."""
    from r3rag.training.modeling import load_model
    from r3rag.training.observe import merge_rollouts, plot_rewards

    if (final / "adapter_config.json").exists():
        from peft import PeftModel

        start = cfg.model or str(Path(base) / "model")
        model = PeftModel.from_pretrained(load_model(start, dtype="float32"), str(final))
    else:
        model = load_model(final, dtype="float32")
    save_policy(model, tokenizer, out, protocol_dict, base)
    metrics = work / "metrics.jsonl"
    shutil.copy(metrics, out / "metrics.jsonl") if metrics.exists() else (out / "metrics.jsonl").touch()
    merge_rollouts(sorted(work.glob("rollouts.rank*.jsonl")), out / "rollouts.jsonl")
    plot_rewards(out / "metrics.jsonl", out / "reward_curves.png")
    if cfg.report_to and (work / "checkpoints" / "runs").is_dir():  # TensorBoard event files
        shutil.copytree(work / "checkpoints" / "runs", out / "tensorboard")


def summarize(rows: list[dict]) -> dict:
    """First and last step of the main curves, and their means over the run."""
    if not rows:
        return {}
    keys = [
        k
        for k in rows[-1]
        if k == "reward" or k.startswith(("rewards/", "rollout/", "critic/")) and not k.endswith("/std")
    ] + [k for k in ("kl", "kl/k1_mean", "entropy", "dev/em", "dev/f1") if k in rows[-1]]
    out = {"steps": rows[-1]["step"]}
    for k in keys:
        vals = [r[k] for r in rows if r.get(k) is not None]
        if vals:
            out.update(
                {
                    f"first_{k}": round(vals[0], 4),
                    f"last_{k}": round(vals[-1], 4),
                    f"mean_{k}": round(sum(vals) / len(vals), 4),
                }
            )
    return out
