"""vLLM's CPU build against transformers, side by side in one run, on SmolLM2-135M-Instruct.

The policy is the short SmolLM2 cold start of tests/test_vllm_real.py (it searches ~2 times a
question), built once in `--runs-dir` and reused; questions are real HotpotQA dev questions,
documents come from the pipeline's BM25 index. Needs vLLM's CPU build (`make install-vllm`), the
[real] extra and the shared data.

1. rollouts: the multi-turn loop (generate -> parse -> search -> documents, until an answer),
   sampled at temperature 1 as GRPO does, for 16 and 64 questions in one batch: transformers
   (`HFGenerator`, its KV cache kept between turns) and vLLM with prefix caching on and off.
   Throughput = the model's own tokens / wall time. `vllm_rollout_speedup` = vLLM (prefix caching
   on) / transformers at batch 64. An engine's start is not timed (reported: `vllm_engine_start_s`).
2. eval: greedy rollouts of the 30 questions at once: questions per second each way.
3. grpo (`--sections grpo`): `r3rag rl` for 2 steps with rl.vllm=colocate and with transformers:
   the second step's time (the first includes the engine's start and warm-up).

Run it alone: both sides share the same 2 cores.

Usage:
    python benchmarks/vllm_cpu.py [--runs-dir runs/bench-vllm] [--sections rollout,eval,grpo]
Last line: {"vllm_rollout_tok_s": ..., "hf_rollout_tok_s": ..., "vllm_rollout_speedup": ..., ...}
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (the cold start's settings)


def cold_start(runs: Path) -> dict:
    import yaml

    from r3rag.experiments.pipeline import run_stages
    from tests.vllm_policy import COLD_START, PIPELINE

    data = yaml.safe_load(PIPELINE.read_text())
    stages = ["model", "world", "index", "synthesize", "sft"]
    return run_stages(PIPELINE, data, stages, {s: COLD_START.get(s, []) for s in stages}, runs)


def timed_rollouts(generator, questions, retriever, protocol, tok, cfg) -> tuple[float, int]:
    from r3rag.core.env import run_rollouts

    t0 = time.perf_counter()
    trajs = run_rollouts(questions, generator, retriever, protocol, cfg, tok)
    seconds = time.perf_counter() - t0
    return seconds, sum(len(turn.ids or ()) for t in trajs for turn in t.turns if turn.role == "model")


def rollout_figures(refs: dict, questions: list[dict], sections: set[str]) -> dict:
    import torch

    from r3rag.core.env import EnvConfig
    from r3rag.core.protocol import Protocol
    from r3rag.generation.hf import HFGenerator
    from r3rag.generation.vllm import EngineSettings, LLMGenerator, load_llm
    from r3rag.retrieval import open_retriever
    from r3rag.training.helpers import load_protocol_dict
    from r3rag.training.modeling import load_policy

    policy = refs["sft"].path
    protocol = Protocol(**load_protocol_dict(policy))
    retriever = open_retriever("", refs["index"])
    sampled = EnvConfig(top_k=3, max_turns=4, max_new_tokens=64)
    out: dict = {}
    model, tok = load_policy(policy)
    model.eval()
    for n in (16, 64):
        if "rollout" in sections:
            torch.manual_seed(0)
            hf = HFGenerator(model, tok, batch_size=n, temperature=1.0, logprobs=True)
            s, tokens = timed_rollouts(hf, questions[:n], retriever, protocol, tok, sampled)
            out[f"hf_rollout_tok_s_{n}"] = round(tokens / s, 1)
    if "eval" in sections:
        s, _ = timed_rollouts(HFGenerator(model, tok, batch_size=32), questions[:30], retriever, protocol, tok, sampled)
        out["hf_eval_q_s"] = round(30 / s, 3)
    del model
    for caching in (True, False) if "rollout" in sections else (True,):
        t0 = time.perf_counter()
        llm = load_llm(str(policy / "model"), "float32", EngineSettings(prefix_caching=caching))
        out["vllm_engine_start_s"] = round(time.perf_counter() - t0, 1)
        suffix = "" if caching else "_no_prefix_cache"
        for n in (16, 64) if "rollout" in sections else ():
            gen = LLMGenerator(llm, tok, temperature=1.0, seed=0)
            s, tokens = timed_rollouts(gen, questions[:n], retriever, protocol, tok, sampled)
            out[f"vllm_rollout_tok_s_{n}{suffix}"] = round(tokens / s, 1)
        if caching and "eval" in sections:
            s, _ = timed_rollouts(LLMGenerator(llm, tok), questions[:30], retriever, protocol, tok, sampled)
            out["vllm_eval_q_s"] = round(30 / s, 3)
        del llm
        gc.collect()
    return out


def grpo_step_seconds(runs: Path, refs: dict, backend: str) -> float:
    from r3rag.experiments.pipeline import run_stage
    from tests.vllm_policy import PIPELINE

    settings = ["steps=2", "prompts_per_step=2", "num_generations=4", "grad_accum=1", "max_new_tokens=48"]
    settings += ["max_turns=2", "max_completion_tokens=640", "save_steps=0", f"vllm={backend}"]
    ref = run_stage("rl", PIPELINE, [*settings, f"policy={refs['sft'].path}", f"name=bench-{backend or 'hf'}"], runs)
    steps = [json.loads(line) for line in (ref.path / "metrics.jsonl").open()]
    return round(steps[-1]["step_time"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/bench-vllm"))
    parser.add_argument("--sections", default="rollout,eval,grpo")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    from r3rag.data.shared import shared_data
    from r3rag.util import quiet
    from r3rag.util.jsonl import read_jsonl

    quiet.configure(verbose=False)
    root = shared_data()
    if root is None:
        sys.exit("error: shared data not found ($R3RAG_DATA, e.g. ../shared/data, or make data)")
    refs = cold_start(args.runs_dir)
    questions = read_jsonl(root / "hotpotqa/dev_distractor_ircot_subsample.jsonl")[:64]
    figures = rollout_figures(refs, questions, sections)
    if "rollout" in sections:
        figures["vllm_rollout_tok_s"] = figures["vllm_rollout_tok_s_64"]
        figures["hf_rollout_tok_s"] = figures["hf_rollout_tok_s_64"]
        figures["vllm_rollout_speedup"] = round(figures["vllm_rollout_tok_s"] / figures["hf_rollout_tok_s"], 3)
    if "grpo" in sections:
        figures["vllm_grpo_step_s"] = grpo_step_seconds(args.runs_dir, refs, "colocate")
        figures["hf_grpo_step_s"] = grpo_step_seconds(args.runs_dir, refs, "")
    print(json.dumps(figures))


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it re-imports this file
    main()
