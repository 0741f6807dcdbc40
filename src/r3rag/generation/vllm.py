"""Rollout generation through vLLM: TRL's integration for RL, or an engine of its own for eval.

- `VLLMGenerator` (`rl.vllm=colocate|server|auto`): TRL owns the vLLM engine and keeps its
  weights in sync with the policy every step; this adapter only runs our multi-turn turns
  through it, one batched call per turn, stopping at the protocol's stop strings.
  colocate: the in-process `vllm.LLM` each rank holds (`trainer.vllm_generation.llm`);
  server: a `trl vllm-serve` server (`rl.vllm_server_url`), through TRL's client.
- `LLMGenerator` (`eval.backend=vllm`): a `vllm.LLM` loaded from a policy's weights or any model
  id / path (`load_llm`), same turns.

vLLM needs a GPU: the test suite checks the adapters against a stand-in `vllm` module;
`require_vllm` gives a clear error when vLLM is asked for and missing.

Usage:
    gen = VLLMGenerator(trainer, temperature=1.0, top_p=1.0)
    gen = LLMGenerator(load_llm("runs/rl/demo-.../model"), tokenizer, temperature=0.0)
    outs = gen.generate(trajectories, stop=("</search>", "</answer>"), max_new_tokens=500)
"""

from __future__ import annotations

from r3rag.env import Generated, Trajectory
from r3rag.errors import UserError


def require_vllm(what: str) -> None:
    from r3rag.extras import installed

    if not installed("vllm"):  # looked up, not imported: importing vLLM takes seconds
        raise UserError(f"{what}: vLLM is not installed (pip install 'r3rag[vllm]', on a machine with a GPU)")


def load_llm(model: str, dtype: str = "auto", gpu_memory: float = 0.9, seed: int = 0):
    """An in-process vLLM engine for a model directory or hub id."""
    from vllm import LLM

    return LLM(model=model, dtype=dtype, gpu_memory_utilization=gpu_memory, seed=seed)


def sample(
    llm,
    prompts: list[list[int]],
    stop: tuple[str, ...],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None = None,
) -> list[tuple[list[int], str, list[float] | None]]:
    """One batched `vllm.LLM.generate` over token-id prompts: (generated ids, finish reason, each id's
    logprob) per prompt, the stop string's tokens kept (as transformers' path keeps them).

    `logprobs=0` asks vLLM for the sampled token's logprob only: TRL's importance-sampling correction
    needs it for the tokens vLLM sampled (HFGenerator(logprobs=True) gives the same on CPU)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=1,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_new_tokens,
        seed=seed,
        stop=list(stop),
        include_stop_str_in_output=True,
        logprobs=0,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason, _sampled_logprobs(o.outputs[0])) for o in outs]


def _sampled_logprobs(output) -> list[float] | None:
    """Per generated id, its logprob from vLLM's per-position {token_id: Logprob} dicts."""
    if getattr(output, "logprobs", None) is None:
        return None
    return [position[tid].logprob for tid, position in zip(output.token_ids, output.logprobs, strict=True)]


def to_generated(tokenizer, ids: list[int], finish: str, logprobs: list[float] | None = None) -> Generated:
    ids = list(ids)
    if ids and ids[-1] == tokenizer.eos_token_id:  # the EOS is dropped with its logprob (as in HFGenerator)
        ids, logprobs = ids[:-1], logprobs and logprobs[:-1]
        return Generated(tokenizer.decode(ids, skip_special_tokens=True), ids, "eos", logprobs=logprobs)
    kind = "length" if finish == "length" else "stop"
    return Generated(tokenizer.decode(ids, skip_special_tokens=True), ids, kind, logprobs=logprobs)


class LLMGenerator:
    def __init__(self, llm, tokenizer, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None):
        self.llm, self.tokenizer = llm, tokenizer
        self.temperature, self.top_p, self.seed = temperature, top_p, seed

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        done = sample(
            self.llm, [c.context_ids() for c in contexts], stop, max_new_tokens, self.temperature, self.top_p, self.seed
        )
        return [to_generated(self.tokenizer, ids, finish, lps) for ids, finish, lps in done]


class VLLMGenerator:
    def __init__(self, trainer, temperature: float = 1.0, top_p: float = 1.0):
        self.vg = trainer.vllm_generation
        self.tokenizer = trainer.processing_class
        self.temperature, self.top_p = temperature, top_p

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        prompts = [c.context_ids() for c in contexts]
        if self.vg.mode == "colocate":
            done = sample(self.vg.llm, prompts, stop, max_new_tokens, self.temperature, self.top_p)
            return [to_generated(self.tokenizer, ids, finish, lps) for ids, finish, lps in done]
        out = self._client().generate(
            prompts=prompts,
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's logprob: (rows, tokens, 1)
            generation_kwargs={"stop": list(stop), "include_stop_str_in_output": True},
        )
        per_row = out.get("logprobs") or [None] * len(out["completion_ids"])
        return [
            to_generated(
                self.tokenizer,
                ids,
                "length" if len(ids) >= max_new_tokens else "stop",
                None if lps is None else [position[0] for position in lps],
            )
            for ids, lps in zip(out["completion_ids"], per_row, strict=True)
        ]

    def _client(self):
        # TRL creates its client (and the weight-sync channel) on the main process only;
        # other ranks only generate, through a plain client of their own.
        client = getattr(self.vg, "vllm_client", None)
        if client is None:
            from trl.generation.vllm_client import VLLMClient

            client = self.vg.vllm_client = VLLMClient(base_url=self.vg.server_base_url)
        return client
