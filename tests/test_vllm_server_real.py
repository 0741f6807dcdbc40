"""GRPO's server mode for real: `r3rag serve-vllm --model sft:latest` runs vLLM's CPU build as its own process on
loopback, the trainer (rl.vllm=server) generates through it and sends each step's weights over gloo
(r3rag.generation.vllm_server); no stand-in.

One run of 2 GRPO steps (one server start fewer than two tests): its server killed after the first
checkpoint gives one line naming --resume and keeps the checkpoint; a new server and `resume=true`
finish the run from it: before step 2's rollouts the trainer sends the new server the checkpoint's
weights, and the server's greedy output moves (the trained weights reached it) and is that
checkpoint's greedy choice under transformers, each token at the log-probability transformers gives
it (the weights are the trainer's, every layer, the tied LM head included); it stops cleanly on Ctrl-C.

~7 min on 2 AVX2 cores (each server start ~1.5 min, each step ~1.5 min). Skips with one line without
vLLM, [real] or the data.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.vllm_policy import (  # noqa: F401 (fixtures)
    PIPELINE,
    greedy_choices_off_the_best,
    logprob_gaps,
    searching_policy,
    vllm_installed,
)

# Two vLLM servers and two GRPO steps on SmolLM2: ~5 min.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]

SETTINGS = ["prompts_per_step=2", "num_generations=4", "grad_accum=1", "max_new_tokens=48", "max_turns=2"]
SETTINGS += ["max_completion_tokens=640", "lr=1e-3", "rewards={em: 1.0, format: 0.5}", "vllm=server"]
# An entropy bonus: step 1 moves the weights whatever its rewards. A step whose groups' rewards are all
# equal gives GRPO no gradient, and on CI's cores one did (reward 0 at step 1): checkpoint 1 was the cold
# start, so the server's greedy output could not move and the sync went untested.
SETTINGS += ["entropy_coef=0.01"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`r3rag serve-vllm` in its own process group (the API server and its engine core)."""

    def __init__(self, runs: Path, log: Path):
        import requests

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "r3rag.cli", "serve-vllm", "--model", "sft:latest", "--runs-dir", str(runs)]
        cmd += ["--port", str(self.port), "--max-model-len", "2048", "--kv-cache-gb", "1"]
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 600
        while time.time() < deadline:
            assert self.proc.poll() is None, f"serve-vllm exited: {log.read_text()[-2000:]}"
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        raise AssertionError(f"serve-vllm did not come up in 600 s: {log.read_text()[-2000:]}")

    def greedy(self, prompt: str) -> tuple[list[int], list[float]]:
        """16 greedy tokens and the log-probability the server gave each."""
        from trl.generation.vllm_client import VLLMClient

        out = VLLMClient(base_url=self.url).generate([prompt], temperature=0.0, max_tokens=16, logprobs=0)
        return out["completion_ids"][0], [top[0] for top in out["logprobs"][0]]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # as Ctrl-C
        return self.proc.wait(timeout=120)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


def _rl(runs, policy: Path, server: Server, *settings: str):
    from r3rag.experiments.pipeline import run_stage

    return run_stage("rl", PIPELINE, [*SETTINGS, f"policy={policy}", f"vllm_server_url={server.url}", *settings], runs)


def _copy_checkpoint(runs: Path, checkpoint: str, to: Path) -> None:
    """Copy a GRPO checkpoint (whole: trainer_state.json is written after the weights)."""
    import shutil

    (state,) = runs.glob(f"rl/**/{checkpoint}/trainer_state.json")
    shutil.copytree(state.parent, to, ignore=shutil.ignore_patterns("optimizer.pt", "rng_state*"))


def _steps(ref) -> list[int]:
    return [json.loads(line)["step"] for line in (ref.path / "metrics.jsonl").open()]


def test_grpo_through_a_vllm_server_a_killed_server_and_resume(searching_policy, tmp_path, monkeypatch):
    """One run of 2 steps: its server killed after the first checkpoint, then resumed on a new one."""
    import r3rag.util.quiet
    from r3rag.stages import rl as rl_stage
    from r3rag.training.modeling import load_model
    from r3rag.util.errors import UserError

    # As `r3rag rl` runs: r3rag's step lines, not the Trainer's tqdm bar. The killed run raises out of
    # Trainer.train() before the bar's on_train_end, and the bar left open at 1/2 printed itself after
    # pytest's summary when the interpreter freed it.
    monkeypatch.setattr(r3rag.util.quiet, "_verbose", False)
    runs, refs = searching_policy
    policy = refs["sft"].path
    settings = ("steps=2", "save_steps=1", "name=server")
    server = first = Server(runs, tmp_path / "server1.log")
    build = rl_stage._trainer

    def killing_the_first_server(cfg, model, tokenizer, *rest):
        from transformers import TrainerCallback

        trainer = build(cfg, model, tokenizer, *rest)

        class KillAfterFirstCheckpoint(TrainerCallback):  # the checkpoint is whole, step 2's sync not begun
            def on_save(self, args, state, control, **kw):
                if state.global_step == 1 and first.proc.poll() is None:
                    first.kill()

        trainer.add_callback(KillAfterFirstCheckpoint())
        return trainer

    monkeypatch.setattr(rl_stage, "_trainer", killing_the_first_server)
    try:
        with pytest.raises(UserError) as lost:
            _rl(runs, policy, server, *settings)
    finally:
        if server.proc.poll() is None:
            server.kill()
    message = str(lost.value)
    assert "\n" not in message and "stopped answering" in message and "--resume" in message
    assert list(runs.glob("rl/**/checkpoint-1/trainer_state.json")), "the last checkpoint was not kept"
    assert '"POST /update_weights HTTP/1.1" 200' in server.log.read_text()  # step 1's weights went over gloo

    step1 = tmp_path / "step1"  # the weights the resumed run sends first: it deletes its checkpoints at the end
    _copy_checkpoint(runs, "checkpoint-1", step1)
    server = Server(runs, tmp_path / "server2.log")
    prompt = "<|im_start|>user\nWho wrote Hamlet?<|im_end|>\n<|im_start|>assistant\n"
    try:
        before = server.greedy(prompt)  # the cold start's weights, as served
        ref = _rl(runs, policy, server, *settings, "resume=true")
        after = server.greedy(prompt)  # the weights the trainer sent before step 2's rollouts
    finally:
        code = server.stop()
    assert _steps(ref)[-1] == 2
    assert json.loads((ref.path / "manifest.json").read_text())["metrics"]["resumed_from_step"] == 1
    start = load_model(policy / "model", dtype="float32").state_dict()
    trained = load_model(ref.path / "model", dtype="float32").state_dict()
    assert any((start[k] - trained[k]).abs().max() > 0 for k in start)
    assert after[0] != before[0], "the server's greedy output did not move: the weights did not reach it"
    # ...and they are checkpoint 1's weights, as the trainer holds them: each greedy token the server gave
    # is that checkpoint's best under transformers in fp32, with the same log-probability (vLLM's
    # layerwise reload repacks its kernels after the update; a layer left on its old copy shows here:
    # until repack_cpu_lm_head the tied LM head did, and a token's choice moved only now and then)
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(step1)(prompt, add_special_tokens=False)["input_ids"]
    step1_policy = load_model(step1, dtype="float32")
    off = greedy_choices_off_the_best(step1_policy, ids, after[0])
    gaps = logprob_gaps(step1_policy, ids, *after)
    print(f"served greedy tokens below transformers' best (nats): {[round(o, 5) for o in off]}")
    print(f"|served logprob - transformers'| (nats): {[round(g, 5) for g in gaps]}")
    assert max(off) < 1e-3 and max(gaps) < 1e-3
    assert code in (0, -signal.SIGINT), f"the server did not stop cleanly ({code}): {server.log.read_text()[-1500:]}"
