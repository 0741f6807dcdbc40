"""The vLLM tests' shared policy: SmolLM2 after a short SFT cold start on real questions, a policy
that searches (tests/test_vllm_real.py, tests/test_vllm_server_real.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "real-smollm2.yaml"
# 10 training questions a data set, 8 oracle trajectories, 8 SFT updates at a high lr: enough for
# SmolLM2 to take up the loop (2 searches a question), in ~4 min on 2 cores. The test split: the first
# 10 HotpotQA, MuSiQue and 2Wiki dev questions, 30 in all.
COLD_START = {
    "world": ["limits={train: 10, test: 10}"],
    "synthesize": ["max_doc_chars=150"],
    "sft": ["epochs=2", "limit=8", "max_length=1024", "lr=3e-4", "grad_accum=1", "warmup_ratio=0", "save_steps=0"],
}


@pytest.fixture(scope="module")
def vllm_installed():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM not installed (make install-vllm)")


@pytest.fixture(scope="module")
def searching_policy(vllm_installed, smollm2_runs, shared_root):
    """(runs, {stage: ref}): SmolLM2 after a short SFT cold start on real questions."""
    import yaml

    from r3rag.experiments.pipeline import run_stages

    runs, model = smollm2_runs
    data = yaml.safe_load(PIPELINE.read_text())
    stages = ["world", "index", "synthesize", "sft"]
    refs = run_stages(PIPELINE, data, stages, {s: COLD_START.get(s, []) for s in stages}, runs, bound={"model": model})
    return runs, refs


def in_own_process(fn, *args):
    """`fn(*args)` in a fresh interpreter, its (picklable) return value back; its error as this
    test's failure. TRL's colocated vLLM engine outlives its trainer in the process that started it
    (held where gc.collect() does not reach: ~5 GB a run on SmolLM2 with its 2 GiB KV cache), so
    two colocated runs and the server test in one pytest process passed 24 GB: each colocated run
    gets a process of its own, and its memory goes with it (~15 s of imports)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # not fork: torch's OpenMP pool does not survive one
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_send_result, args=(send, fn, args))
    child.start()
    send.close()
    try:
        ok, value = receive.recv()
    except EOFError:  # it died without a word: killed (out of memory, say)
        ok, value = False, "no result"
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    if not ok:
        pytest.fail(f"{fn.__name__} in its own process (exit code {child.exitcode}): {value}", pytrace=False)
    return value


def _send_result(send, fn, args) -> None:
    import traceback

    try:
        send.send((True, fn(*args)))
    except BaseException:
        send.send((False, traceback.format_exc()))
    finally:
        send.close()


def _continuation_logprobs(model, prompt: list[int], tokens: list[int]):
    """`model`'s log-probabilities (fp32) at each position of a continuation: [len(tokens), vocab]."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)


def greedy_choices_off_the_best(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """For each token of a greedy continuation, how far (nats) `model` scores it below its own best."""
    logprobs = _continuation_logprobs(model, prompt, tokens)
    return [(logprobs[i].max() - logprobs[i, t]).item() for i, t in enumerate(tokens)]


def logprob_gaps(model, prompt: list[int], tokens: list[int], served: list[float]) -> list[float]:
    """For each token of a continuation, |the log-probability an engine gave it - `model`'s| (nats)."""
    logprobs = _continuation_logprobs(model, prompt, tokens)
    return [abs(served[i] - logprobs[i, t].item()) for i, t in enumerate(tokens)]
