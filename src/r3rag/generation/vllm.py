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
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UserError(f"{what}: vLLM is not installed (pip install vllm)")


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
) -> list[tuple[list[int], str]]:
    """One batched `vllm.LLM.generate` over token-id prompts: (generated ids, finish reason) per prompt,
    the stop string's tokens kept (as transformers' path keeps them)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=1,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_new_tokens,
        seed=seed,
        stop=list(stop),
        include_stop_str_in_output=True,
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]


def to_generated(tokenizer, ids: list[int], finish: str) -> Generated:
    ids = list(ids)
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
        return Generated(tokenizer.decode(ids, skip_special_tokens=True), ids, "eos")
    return Generated(tokenizer.decode(ids, skip_special_tokens=True), ids, "length" if finish == "length" else "stop")


class LLMGenerator:
    def __init__(self, llm, tokenizer, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None):
        self.llm, self.tokenizer = llm, tokenizer
        self.temperature, self.top_p, self.seed = temperature, top_p, seed

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        done = sample(
            self.llm, [c.context_ids() for c in contexts], stop, max_new_tokens, self.temperature, self.top_p, self.seed
        )
        return [to_generated(self.tokenizer, ids, finish) for ids, finish in done]


class VLLMGenerator:
    def __init__(self, trainer, temperature: float = 1.0, top_p: float = 1.0):
        self.vg = trainer.vllm_generation
        self.tokenizer = trainer.processing_class
        self.temperature, self.top_p = temperature, top_p

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        prompts = [c.context_ids() for c in contexts]
        if self.vg.mode == "colocate":
            done = sample(self.vg.llm, prompts, stop, max_new_tokens, self.temperature, self.top_p)
            return [to_generated(self.tokenizer, ids, finish) for ids, finish in done]
        out = self._client().generate(
            prompts=prompts,
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_new_tokens,
            logprobs=None,
            generation_kwargs={"stop": list(stop), "include_stop_str_in_output": True},
        )
        return [
            to_generated(self.tokenizer, ids, "length" if len(ids) >= max_new_tokens else "stop")
            for ids in out["completion_ids"]
        ]

    def _client(self):
        # TRL creates its client (and the weight-sync channel) on the main process only;
        # other ranks only generate, through a plain client of their own.
        client = getattr(self.vg, "vllm_client", None)
        if client is None:
            from trl.generation.vllm_client import VLLMClient

            client = self.vg.vllm_client = VLLMClient(base_url=self.vg.server_base_url)
        return client
