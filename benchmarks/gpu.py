"""GPU figures (run by benchmarks/gpu.sh on one CUDA device; `--smoke` checks it on a CPU).

1. rollout: a randomly initialised Qwen2.5-0.5B-shaped model (bf16) on synthetic-world
   prompts at batch 64 and 256: the multi-turn env with transformers' dynamic cache, the env
   with the compiled static-cache path (`HFGenerator(static_cache=True)`, `rl.static_cache=true`),
   and plain `model.generate` in which each row writes as many tokens as its trajectory's
   model turns did (no stops, retrieval or documents). A random model never writes a tag, so
   `policy.ScriptedTurns` makes it write like a searching policy (two searches of 4-12 words, then a
   short answer): the forward passes are its own, only the chosen token is forced, so the env's
   turns, BM25 searches and document encoding are real. `gpu_rollout_speedup_b256` = env
   tokens/s on the static path / plain generate tokens/s; `env_overhead_dynamic` = plain
   generate tokens/s / env tokens/s (dynamic cache) - 1.
2. grpo: one `r3rag rl` step of that model (16 prompts x 8), with LoRA and with full
   fine-tuning: seconds per step and peak GPU memory.
3. demo: `r3rag run pipelines/demo.yaml` on the device, then the same with a larger 8x512
   policy: held-out EM per system and wall seconds per stage.
4. dense (issue 18; not in the default parts, `--parts dense`): benchmarks/retrieval_scale_dense.py's
   section at 200,000 passages of the shared pools' real text, encoded by all-MiniLM-L6-v2 on the
   GPU: IVF-PQ's recall@10 against exact search, bytes a passage, MiniLM passages/s; then the
   passages/s of an E5-base-shaped encoder (BERT-base, random weights, fp16, "passage: " prefix,
   through r3rag's own `Encoder`) on 20,000 of those passages, for the 21M-passage projection.
   Needs the shared pools ($R3RAG_DATA), faiss and MiniLM: benchmarks/gpu_dense_carry.sh packs them.
The parts run in that order (the issue's headline figure first), each printing its figures as
it ends; a part (or the demo's second policy) that would start after `--deadline-s` is skipped
and reported as such, so a time-limited run still ends with its JSON line.

Usage:
    python benchmarks/gpu.py [--parts rollout,grpo,demo] [--smoke] [--deadline-s 420]
    python benchmarks/gpu.py --parts dense [--dense-encoder DIR]   # issue 18's dense figures
    (the device command that carries what the dense part needs: benchmarks/gpu_dense_carry.sh)
Last line: {"gpu_rollout_speedup_b256": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from r3rag.util.nojax import block_jax  # noqa: E402

block_jax()  # before bm25s: it imports JAX when present, and forking after that deadlocks

import torch  # noqa: E402

QWEN_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
)
SMOKE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=2000,
)
LARGER = ["sft.layers=8", "sft.hidden=512", "sft.heads=8", "sft.intermediate=2048"]
SMOKE_DEMO = ["synthesize.extra_worlds=2", "synthesize.limit=200", "sft.layers=1", "rl.steps=2", "eval.limit=40"]


def demo(runs: Path, smoke: bool, deadline: float) -> dict:
    out = {}
    for label, extra in (("4x128", []), ("8x512", LARGER + ["eval.name=demo-8x512"])):
        if time.time() > deadline:
            out[label] = "skipped: past --deadline-s"
            continue
        t0 = time.time()
        sets = [a for s in (SMOKE_DEMO if smoke else []) + extra for a in ("--set", s)]
        subprocess.run(
            [sys.executable, "-m", "r3rag.cli", "run", "pipelines/demo.yaml", "--runs-dir", str(runs), *sets],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.time() - t0
        evals = sorted((runs / "eval").glob("*/metrics.json"), key=lambda p: p.stat().st_mtime)
        m = json.loads(evals[-1].read_text())
        out[label] = {
            "em": {s: v["em"] for s, v in m["systems"].items()},
            "seconds": m["seconds"],
            "wall_seconds": round(wall, 1),
        }
        print(f"demo {label}: EM {out[label]['em']}  seconds {m['seconds']}  wall {wall:.0f} s", flush=True)
    return out


def random_qwen(shape: dict, device: str):
    """A random Qwen2-architecture model of `shape` and a word tokenizer with its vocabulary size."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from r3rag.data.world import WorldConfig, world_vocabulary
    from r3rag.training.modeling import train_word_tokenizer

    words = world_vocabulary(WorldConfig())
    filler = [f"w{i}" for i in range(max(0, shape["vocab_size"] - len(words) - 16))]
    tok = train_word_tokenizer([" ".join(words), " ".join(filler), "Question :"])
    cfg = Qwen2Config(
        **{**shape, "vocab_size": len(tok)},
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).eval(), tok


def rollout(shape: dict, device: str, batches: list[int]) -> dict:
    from policy import ScriptedTurns  # benchmarks/policy.py
    from rollout import plain_generate

    from r3rag.core.env import EnvConfig, run_rollouts
    from r3rag.core.protocol import Protocol
    from r3rag.data.world import WorldConfig, generate_world
    from r3rag.generation.hf import HFGenerator
    from r3rag.retrieval.bm25 import BM25Retriever

    model, tok = random_qwen(shape, device)
    world = generate_world(WorldConfig())
    retriever = BM25Retriever.build(world.docs)
    protocol, env = Protocol(template="minimal", doc_style="plain"), EnvConfig(max_new_tokens=48, max_turns=4)
    out = {}

    def timed(fn):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, result

    for b in batches:
        questions = (world.test * (b // len(world.test) + 1))[:b]

        def env_run(static: bool, b=b, questions=questions):
            gen = HFGenerator(
                model, tok, batch_size=b, temperature=1.0, static_cache=static, logits_processors=[ScriptedTurns(tok)]
            )
            return run_rollouts(questions, gen, retriever, protocol, env, tok)

        row = {}
        for name, static in (("env_dynamic", False), ("env_static", True)):
            env_run(static)  # warm up (compiles the static path)
            t, trajs = timed(lambda static=static: env_run(static))
            tokens = sum(tr.model_token_count() for tr in trajs)
            row[name] = round(tokens / t, 1)
        lengths, prompts = [tr.model_token_count() for tr in trajs], [tr.prompt_ids for tr in trajs]
        plain_generate(model, tok, prompts, lengths, sample=True)  # warm up
        t_plain = plain_generate(model, tok, prompts, lengths, sample=True)
        row["plain_generate"] = round(sum(lengths) / t_plain, 1)
        row["searches_per_trajectory"] = round(sum(len(tr.queries) for tr in trajs) / b, 2)
        row["model_tokens_per_trajectory"] = round(sum(lengths) / b, 1)
        row["env_overhead_dynamic"] = round(row["plain_generate"] / row["env_dynamic"] - 1, 3)
        row["speedup_static_vs_plain"] = round(row["env_static"] / row["plain_generate"], 2)
        out[b] = row
        print(f"rollout b{b}: tokens/s {row}", flush=True)
    return out


def grpo(shape: dict, device: str, runs: Path) -> dict:
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl

    model, tok = random_qwen(shape, device)
    model_dir = runs / "qwen-random"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    del model
    run_stage("world", None, [], runs)
    run_stage("index", None, [], runs)
    out = {}
    for label, lora in (("lora", True), ("full", False)):
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        ref = run_stage(
            "rl",
            None,
            [
                f"name={label}",
                f"model={model_dir}",
                "template=minimal",
                "doc_style=plain",
                "steps=2",
                "prompts_per_step=16",
                "num_generations=8",
                f"lora={str(lora).lower()}",
                "save_steps=0",
                "rollout_samples=0",
                "max_new_tokens=48",
                "max_turns=4",
            ],
            runs,
        )
        last = read_jsonl(ref.path / "metrics.jsonl")[-1]  # the second step: warmed up
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
        out[label] = {
            "seconds_per_step": round(last["time/step"], 2),
            "generation_s": round(last["time/generation"], 2),
            "peak_gib": None if peak is None else round(peak, 1),
        }
        print(f"grpo {label}: {out[label]}", flush=True)
    return out


def dense(smoke: bool, work: Path, encoder: str) -> dict:
    """IVF-PQ against Flat on MiniLM vectors of 200k real passages, and E5-base-shaped encoding speed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from retrieval_scale_dense import _shared_root, add_arguments, dense_section, dense_texts

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    n, queries = (300, 64) if smoke else (200_000, 1000)
    args = ap.parse_args(
        ["--dense-passages", str(n), "--dense-queries", str(queries), "--dense-chunk-size", "50000"]
        + ["--dense-encoder", encoder]
    )
    work.mkdir(parents=True, exist_ok=True)
    out = dense_section(work, args, {})
    texts, _ = dense_texts(_shared_root(), 100 if smoke else 20_000)
    out["e5_base_shaped_passages_per_s"] = _e5_base_rate(texts, work / "e5-base-shaped", smoke, encoder)
    print(f"dense: {out}", flush=True)
    return out


def _e5_base_rate(texts: list[str], where: Path, smoke: bool, encoder: str) -> float:
    """Passages/s of r3rag's Encoder on a BERT-base-shaped model (E5-base's architecture) with MiniLM's
    tokenizer (the same uncased WordPiece vocabulary): Search-R1's retriever's cost a passage."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from r3rag.retrieval.dense import Encoder, resolve_encoder

    shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128) if smoke else {}
    BertModel(BertConfig(**shape)).save_pretrained(where)  # BertConfig() is BERT-base: 768 x 12 layers
    AutoTokenizer.from_pretrained(resolve_encoder(encoder)).save_pretrained(where)
    enc = Encoder(str(where), pooling="mean", max_length=256)
    passages = [f"passage: {t}" for t in texts]
    enc.encode(passages[:512], 256, True)  # warm up (CUDA kernels, allocator)
    if enc.device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    enc.encode(passages, 256, True)
    if enc.device.startswith("cuda"):
        torch.cuda.synchronize()
    return len(passages) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="rollout,grpo,demo")
    ap.add_argument("--deadline-s", type=float, default=420, help="start no part after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device there is")
    ap.add_argument("--out", default="", help="where runs go (default: a temp dir)")
    ap.add_argument("--dense-encoder", default="", help="dense part: MiniLM's directory (default: its package)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape, batches = (SMOKE, [8, 16]) if args.smoke else (QWEN_05B, [64, 256])
    parts = args.parts.split(",")
    print(f"device: {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}; torch {torch.__version__}")
    runs = Path(args.out or tempfile.mkdtemp(prefix="r3rag-gpu-"))
    start = time.time()
    deadline = start + args.deadline_s
    steps = {
        "rollout": lambda: rollout(shape, device, batches),
        "grpo": lambda: grpo(shape, device, runs / "grpo"),
        "demo": lambda: demo(runs / "demo", args.smoke, deadline),
        "dense": lambda: dense(args.smoke, runs / "dense", args.dense_encoder),
    }
    result: dict = {}
    for part in (p for p in steps if p in parts):
        result[part] = steps[part]() if time.time() < deadline else "skipped: past --deadline-s"
        print(f"{part}: done {time.time() - start:.0f} s after the start", flush=True)
    final: dict = {"device": device}
    if isinstance(result.get("rollout"), dict):
        top = max(result["rollout"])
        final[f"gpu_rollout_speedup_b{top}"] = result["rollout"][top]["speedup_static_vs_plain"]
        final.update({f"rollout_tokens_per_s_b{b}": r for b, r in result["rollout"].items()})
    if isinstance(result.get("dense"), dict):  # issue 18's key names at the top level
        final.update(result.pop("dense"))
    final.update({k: v for k, v in result.items() if k != "rollout" or not isinstance(v, dict)})
    print(json.dumps(final))


if __name__ == "__main__":
    main()
