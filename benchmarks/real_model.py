"""Speeds of a real pretrained model on CPU: SmolLM2-135M-Instruct (134.5M parameters, 49k vocab).

Imports SmolLM2 as a `model` artifact into a temp runs dir (~30 s; `--model DIR` reuses an
imported `model/` directory), then measures on `--threads` threads (default 2):

- `real_generate_tok_s_bs16`: one plain `model.generate` over 16 rows, 64 new tokens each
  (greedy, no early stop), prompts = the Search-R1 chat prompt of real HotpotQA dev questions
  (~170 tokens) when the shared data exists, else the synthetic world's questions;
  generated tokens per second of the whole call (prompt encoding included).
- `real_env_overhead_cpu`: the batched env (`run_rollouts`, 16 trajectories, KV cache kept
  between turns, BM25 top-3 over the HotpotQA dev pool, documents cut at 300 characters as in
  pipelines/real-smollm2.yaml) vs one plain `generate` in which each row writes as many tokens
  as its trajectory's model turns did (benchmarks/rollout.py's definition: t_env / t_plain - 1;
  best of `--repeats`). The untrained model does not search by itself, so `ForcedTurns` (a
  logits processor) makes every row search twice (query: words of its question) and answer:
  the turns, documents, stops and forward passes are real, the words are scripted.
- `real_sft_tok_s`: full fine-tuning with TRL's SFTTrainer (r3rag's FastSFTTrainer) on
  batches of 4 x 512-token sequences of corpus text; tokens per second over the steps after
  the first (warm-up).
- `real_grpo_step_s`: seconds of the second GRPO step (the first warms up; both reported)
  through `r3rag.rl.grpo.build_trainer` with the real multi-turn rollout_func: 8 prompts x 4
  generations (one rollout batch, trained in 4 micro-batches of 8: one of 32 went past 24 GB),
  max_turns 2, 24 new tokens per turn, sampling at T = 1, BM25 as above, EM reward, steered
  by `ForcedTurns` (one search, then an answer) so every trajectory is multi-turn.
  `--compare-scoring` runs that step twice, the loss's LM head scoring the model's tokens only
  (r3rag's default: `ResumableGRPOTrainer.skip_retrieved`) and every completion token (TRL's),
  and reports `real_grpo_step_s_scoring_all`, each arm's training seconds (the step less its
  rollouts) and `grpo_train_speedup_skip_retrieved` (all-scored / own-tokens training seconds).
  `--compare-skip` runs that step twice on rewards that give half the groups a signal (the first
  sample of every other group scores 1, the rest 0: a real cold start's share, issue 47), the
  loss's pass over every row and over the rows whose advantage is not 0 (r3rag's default:
  `ResumableGRPOTrainer.skip_zero_advantage`), and reports `real_grpo_step_s_all_rows`, each arm's
  training seconds, `grpo_rows_scored` and `grpo_train_speedup_skip_zero_advantage`.
`--sections grpo` (comma-separated: generate, env, sft, grpo) measures only those figures.

Training runs with the stages' default `bf16: auto` (bf16 autocast only on a CPU with native bf16,
AVX512-BF16 or AMX; fp32 elsewhere; `--bf16 true|false` forces it).
Timings drift by tens of percent on a shared machine: the figures hold for the load it had.

Usage:
    python benchmarks/real_model.py [--model runs/model/<id>/model] [--threads 2] [--quick]
Last line: {"real_generate_tok_s_bs16": ..., "real_sft_tok_s": ..., "real_grpo_step_s": ...,
            "real_env_overhead_cpu": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from rollout import plain_generate  # noqa: E402  (benchmarks/rollout.py)
from transformers import LogitsProcessor, TrainerCallback  # noqa: E402

from r3rag.core.env import EnvConfig, run_rollouts  # noqa: E402
from r3rag.core.protocol import Protocol  # noqa: E402
from r3rag.generation.hf import HFGenerator  # noqa: E402

PROTOCOL = Protocol(template="search-r1", doc_style="search-r1", chat=True, max_doc_chars=300)
DOC_MARK = "Doc 1(Title:"  # only the environment's documents contain it
FULL = dict(
    gen_rows=16,
    gen_tokens=64,
    env_rows=16,
    env_tokens=24,
    env_searches=2,
    sft_rows=4,
    sft_len=512,
    sft_steps=3,
    prompts=8,
    group=4,
    grpo_tokens=24,
    grad_accum=4,
)
QUICK = dict(
    gen_rows=2,
    gen_tokens=4,
    env_rows=2,
    env_tokens=24,
    env_searches=1,
    sft_rows=2,
    sft_len=32,
    sft_steps=2,
    prompts=2,
    group=2,
    grpo_tokens=24,
    grad_accum=1,
)  # 24: a forced search turn is ~15 tokens


class ForcedTurns(LogitsProcessor):
    """Makes the model write like a searching policy: a row whose context holds fewer than
    `searches` document turns writes ` <search> <6 words of its question> </search>`, else
    ` <answer> <1-3 words> </answer>` (every other logit -inf, so sampling picks it too).
    A new generate call (the ids do not continue the previous step's) scripts every row anew."""

    def __init__(self, tok, searches: int):
        self.tok, self.searches, self.prev = tok, searches, None

    def _script(self, row: list[int]) -> list[int]:
        text = self.tok.decode(row, skip_special_tokens=True)
        found = re.search(r"Question: (.*)", text)
        words = (found.group(1) if found else "the question").split()
        done = text.count(DOC_MARK)
        seed = zlib.crc32(text.encode())
        if done < self.searches:
            query = words[3 * done : 3 * done + 6] or words[:6]
            return self.tok.encode(f" <search> {' '.join(query)} </search>", add_special_tokens=False)
        answer = words[-1 - seed % 3 :]
        return self.tok.encode(f" <answer> {' '.join(answer)} </answer>", add_special_tokens=False)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        prev, self.prev = self.prev, input_ids
        if not (
            prev is not None
            and input_ids.shape == (prev.shape[0], prev.shape[1] + 1)
            and torch.equal(input_ids[:, :-1], prev)
        ):
            self.start = input_ids.shape[1]
            scripts = [self._script(row) for row in input_ids.tolist()]
            width = max(map(len, scripts))  # a finished row repeats its last token (it is stopped)
            self.scripts = torch.tensor([s + s[-1:] * (width - len(s)) for s in scripts], device=scores.device)
        forced = self.scripts[:, min(input_ids.shape[1] - self.start, self.scripts.shape[1] - 1)]
        return torch.full_like(scores, float("-inf")).scatter_(1, forced[:, None], 0.0)


class StepClock(TrainerCallback):
    """Wall seconds of every optimizer step (rollouts included for GRPO)."""

    def __init__(self):
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.t0)


def model_dir(arg: str | None, tmp: Path) -> Path:
    if arg:
        return Path(arg)
    from r3rag.experiments.pipeline import run_stage

    return run_stage("model", None, [], tmp / "runs").path / "model"


def data():
    """(questions, corpus docs, source): HotpotQA dev + its context pool, else the synthetic world."""
    from r3rag.data.shared import shared_data

    root = shared_data()
    if root is not None and (root / "corpus/hotpotqa_dev_context_pool.jsonl").is_file():
        from r3rag.data.corpus import load_corpus
        from r3rag.util.jsonl import read_jsonl

        return (
            read_jsonl(root / "hotpotqa/dev_distractor_ircot_subsample.jsonl"),
            load_corpus(root / "corpus/hotpotqa_dev_context_pool.jsonl"),
            "hotpotqa",
        )
    from r3rag.data.world import WorldConfig, generate_world

    world = generate_world(WorldConfig(seed=123))
    return world.train + world.test, world.docs, "synthetic world"


def load(path: Path):
    from r3rag.training.modeling import load_model, load_tokenizer

    return load_model(path, dtype="float32"), load_tokenizer(path)


def bench_generate(model, tok, questions, s) -> tuple[float, float]:
    prompts = [
        tok.encode(PROTOCOL.context_prompt(q["question"], tok), add_special_tokens=False)
        for q in questions[: s["gen_rows"]]
    ]
    plain_generate(model, tok, prompts[:2], [2, 2])  # warm up
    t = plain_generate(model, tok, prompts, [s["gen_tokens"]] * len(prompts))
    return len(prompts) * s["gen_tokens"] / t, statistics.mean(map(len, prompts))


def bench_env(model, tok, questions, retriever, s, repeats: int) -> dict:
    cfg = EnvConfig(
        max_turns=s["env_searches"] + 1, max_new_tokens=s["env_tokens"], top_k=3, max_completion_tokens=4096
    )
    qs = questions[: s["env_rows"]]

    def rollouts():
        gen = HFGenerator(model, tok, batch_size=len(qs), logits_processors=[ForcedTurns(tok, s["env_searches"])])
        t0 = time.perf_counter()
        trajs = run_rollouts(qs, gen, retriever, PROTOCOL, cfg, tok)
        return time.perf_counter() - t0, trajs

    rollouts()  # warm up
    t_env = t_plain = float("inf")
    for _ in range(repeats):
        t, trajs = rollouts()
        t_env = min(t_env, t)
        lengths = [tr.model_token_count() for tr in trajs]
        t_plain = min(t_plain, plain_generate(model, tok, [tr.prompt_ids for tr in trajs], lengths))
    n = len(trajs)
    return {
        "real_env_overhead_cpu": round(t_env / t_plain - 1, 3),
        "env_seconds": round(t_env, 2),
        "env_plain_seconds": round(t_plain, 2),
        "env_model_tokens": round(sum(lengths) / n, 1),
        "env_doc_tokens": round(sum(len(x.ids) for tr in trajs for x in tr.turns if x.role == "env") / n, 1),
        "env_searches": round(sum(len(tr.retrieved) for tr in trajs) / n, 2),
        "env_answered": sum(tr.finish_reason == "answer" for tr in trajs) / n,
    }


def bench_sft(path: Path, docs, s, bf16, work: Path) -> tuple[float, list[float]]:
    from datasets import Dataset
    from trl import SFTConfig

    from r3rag.training.helpers import checkpointing_flag, device_flags
    from r3rag.training.trainers import FastSFTTrainer

    model, tok = load(path)
    stream: list[int] = []
    need = s["sft_rows"] * s["sft_len"] * s["sft_steps"]
    for d in docs:
        stream += tok.encode(d["text"], add_special_tokens=False) + [tok.eos_token_id]
        if len(stream) >= need:
            break
    seqs = [stream[i : i + s["sft_len"]] for i in range(0, need, s["sft_len"])]
    ds = Dataset.from_dict({"input_ids": seqs, "labels": seqs})
    clock = StepClock()
    args = SFTConfig(
        output_dir=str(work / "sft"),
        max_steps=s["sft_steps"],
        per_device_train_batch_size=s["sft_rows"],
        learning_rate=5e-5,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        max_length=s["sft_len"],
        dataloader_num_workers=0,
        disable_tqdm=True,
        **checkpointing_flag(False),
        **device_flags(bf16),
    )
    FastSFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[clock]).train()
    step = statistics.mean(clock.times[1:] or clock.times)
    return s["sft_rows"] * s["sft_len"] / step, clock.times


def compare_scoring(path: Path, questions, retriever, s, bf16, work: Path) -> dict:
    """The GRPO step with the loss's LM head over every completion token, then over the model's own."""
    out = compare_flag("skip_retrieved", "scoring_all", path, questions, retriever, s, bf16, work)
    off = out.pop("off")
    return {**out, "grpo_completion_tokens_scoring_all": off["grpo_completion_tokens"]}


def compare_skip(path: Path, questions, retriever, s, bf16, work: Path) -> dict:
    """The GRPO step with half the groups carrying signal, the loss's pass over every row, then
    over the rows with a non-zero advantage."""
    scorer = HalfTheGroups(s["group"])
    out = compare_flag("skip_zero_advantage", "all_rows", path, questions, retriever, s, bf16, work, scorer)
    off = out.pop("off")
    return {**out, "grpo_rows_scored_all_rows": off["grpo_rows_scored"]}


def compare_flag(flag: str, suffix: str, path: Path, questions, retriever, s, bf16, work: Path, scorer=None) -> dict:
    """The GRPO step with `ResumableGRPOTrainer.<flag>` off, then on (r3rag's default): the second
    arm's figures, the first's step seconds (`real_grpo_step_s_<suffix>`), both arms' training
    seconds (the step less its rollouts) and their ratio; `off`: the first arm's figures."""
    from r3rag.training.trainers import ResumableGRPOTrainer

    setattr(ResumableGRPOTrainer, flag, False)
    try:
        off = bench_grpo(path, questions, retriever, s, bf16, work / "off", scorer)
    finally:
        setattr(ResumableGRPOTrainer, flag, True)
    on = bench_grpo(path, questions, retriever, s, bf16, work / "on", scorer)
    train = {k: r["real_grpo_step_s"] - r["grpo_generation_s"] for k, r in (("off", off), ("on", on))}
    return {
        **on,
        f"real_grpo_step_s_{suffix}": off["real_grpo_step_s"],
        "grpo_train_s": round(train["on"], 2),
        f"grpo_train_s_{suffix}": round(train["off"], 2),
        f"grpo_train_speedup_{flag}": round(train["off"] / train["on"], 3),
        "off": off,
    }


class HalfTheGroups:
    """A reward scorer (RewardScorer's interface) whose EM is 1 for the first sample of every other
    group and 0 elsewhere: half the groups carry signal, whatever the model writes."""

    names = ["em"]
    step_credit = False

    def __init__(self, group: int):
        self.group = group

    def trl_weights(self) -> dict[str, float]:
        return {"em": 1.0}

    def score_steps(self, trajs, examples):
        em = [float(i % self.group == 0 and (i // self.group) % 2 == 0) for i in range(len(trajs))]
        return [{"em": x} for x in em], [[] for _ in trajs]


def bench_grpo(path: Path, questions, retriever, s, bf16, work: Path, scorer=None) -> dict:
    import r3rag.generation.hf as hf
    from r3rag.rl.grpo import build_trainer
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.stages.rl import Config

    model, tok = load(path)

    class Steered(hf.HFGenerator):  # what grpo.generator builds, with ForcedTurns added
        def __init__(self, *a, **k):
            super().__init__(*a, **k, logits_processors=[ForcedTurns(tok, 1)])

    # grad_accum 4: micro-batches of 8 completions (one of 32 x ~500 tokens x 49k-vocab logits
    # took the process past 24 GB and the kernel killed it); the 32 rollouts are still one batch.
    cfg = Config(
        steps=2,
        prompts_per_step=s["prompts"],
        num_generations=s["group"],
        max_turns=2,
        grad_accum=s["grad_accum"],
        max_new_tokens=s["grpo_tokens"],
        top_k=3,
        max_completion_tokens=1024,
        lr=1e-6,
        bf16=bf16,
        save_steps=0,
        vllm="",
        rollout_samples=0,
    )
    scorer = scorer or RewardScorer({"em": 1.0}, RewardSettings(), PROTOCOL)
    clock = StepClock()
    trainer = build_trainer(
        model, tok, questions[: 4 * s["prompts"]], retriever, PROTOCOL, scorer, cfg, work / "grpo", [clock]
    )
    batches = []
    inner = trainer.rollout_func

    def recording(prompts, tr):
        out = inner(prompts, tr)
        batches.append(out)
        return out

    trainer.rollout_func = recording
    original, hf.HFGenerator = hf.HFGenerator, Steered  # grpo.generator imports it at every rollout
    try:
        trainer.train()
    finally:
        hf.HFGenerator = original
    last = batches[-1]
    return {
        "real_grpo_step_s": round(clock.times[-1], 2),
        "grpo_step_seconds": [round(t, 2) for t in clock.times],
        "grpo_generation_s": round(last["timing"]["generation"], 2),
        "grpo_searches": statistics.mean(last["num_searches"]),
        "grpo_completion_tokens": statistics.mean(map(len, last["completion_ids"])),
        "grpo_rows_scored": [h["loss/rows_scored"] for h in trainer.state.log_history if "loss/rows_scored" in h][-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="an imported model directory (runs/model/<id>/model); default: import one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="env overhead: best of this many rounds")
    ap.add_argument("--bf16", default="auto", help="training autocast: auto (the stages' default), true, false")
    ap.add_argument("--quick", action="store_true", help="a smoke run with everything shrunk (< 2 min)")
    ap.add_argument("--sections", default="generate,env,sft,grpo", help="which figures to measure")
    ap.add_argument("--compare-scoring", action="store_true", help="grpo: own tokens vs every token in the loss")
    ap.add_argument("--compare-skip", action="store_true", help="grpo: rows with advantage 0 skipped vs scored")
    args = ap.parse_args()
    todo = set(args.sections.split(","))
    bf16 = {"true": True, "false": False}.get(args.bf16.lower(), args.bf16)
    s = QUICK if args.quick else FULL
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    from r3rag.retrieval.bm25 import BM25Retriever

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = model_dir(args.model, work)
        questions, docs, source = data()
        retriever = BM25Retriever.build(docs)
        model, tok = load(path)
        model.eval()
        gen_tok_s = prompt_len = sft_tok_s = None
        sft_times, env, grpo = [], {"real_env_overhead_cpu": None}, {"real_grpo_step_s": None}
        if "generate" in todo:
            gen_tok_s, prompt_len = bench_generate(model, tok, questions, s)
            print(
                f"plain generate, {s['gen_rows']} rows x {s['gen_tokens']} tokens, {prompt_len:.0f}-token "
                f"prompts: {gen_tok_s:.1f} tokens/s",
                file=sys.stderr,
            )
        if "env" in todo:
            env = bench_env(model, tok, questions, retriever, s, 1 if args.quick else args.repeats)
            print(f"env: {env}", file=sys.stderr)
        del model
        if "sft" in todo:
            sft_tok_s, sft_times = bench_sft(path, docs, s, bf16, work)
            print(f"sft: {sft_tok_s:.0f} tokens/s (steps {[round(t, 2) for t in sft_times]})", file=sys.stderr)
        if "grpo" in todo:
            bench = compare_skip if args.compare_skip else compare_scoring if args.compare_scoring else bench_grpo
            grpo = bench(path, questions, retriever, s, bf16, work)
            print(f"grpo: {grpo}", file=sys.stderr)
    r = lambda x, n=1: None if x is None else round(x, n)  # noqa: E731
    print(
        json.dumps(
            {
                "real_generate_tok_s_bs16": r(gen_tok_s),
                "real_sft_tok_s": r(sft_tok_s),
                "real_grpo_step_s": grpo.pop("real_grpo_step_s"),
                "real_env_overhead_cpu": env.pop("real_env_overhead_cpu"),
                "prompt_tokens": r(prompt_len),
                "sft_step_seconds": [round(t, 2) for t in sft_times],
                **grpo,
                **env,
                "grpo_grad_accum": s["grad_accum"],
                "data": source,
                "bf16": bf16,
                "threads": args.threads,
                "quick": args.quick,
                "sections": args.sections,
                "wall_seconds": round(time.perf_counter() - t_start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
