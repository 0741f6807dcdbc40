"""Rollout generation through TRL's vLLM integration (`rl.vllm=colocate` or `server`).

TRL owns the vLLM engine and keeps its weights in sync with the policy every step; this
adapter only runs our multi-turn turns through it, one batched call per turn, stopping at
the protocol's stop strings.

- colocate: the in-process `vllm.LLM` each rank holds (`trainer.vllm_generation.llm`);
- server: a `trl vllm-serve` server (`rl.vllm_server_url`), through TRL's client.

Not exercised by the CPU test suite (vLLM needs a GPU); `r3rag.grpo.check_vllm` gives a
clear error when vLLM is asked for and missing.

Usage:
    gen = VLLMGenerator(trainer, temperature=1.0, top_p=1.0)
    outs = gen.generate(trajectories, stop=("</search>", "</answer>"), max_new_tokens=500)
"""

from __future__ import annotations

from r3rag.env import Generated, Trajectory


class VLLMGenerator:
    def __init__(self, trainer, temperature: float = 1.0, top_p: float = 1.0):
        self.vg = trainer.vllm_generation
        self.eos = trainer.processing_class.eos_token_id
        self.tokenizer = trainer.processing_class
        self.temperature, self.top_p = temperature, top_p

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        prompts = [c.context_ids() for c in contexts]
        if self.vg.mode == "colocate":
            from vllm import SamplingParams

            params = SamplingParams(n=1, temperature=self.temperature, top_p=self.top_p, max_tokens=max_new_tokens,
                                    stop=list(stop), include_stop_str_in_output=True)
            outs = self.vg.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params,
                                        use_tqdm=False)
            return [self._result(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]
        out = self._client().generate(prompts=prompts, n=1, temperature=self.temperature, top_p=self.top_p,
                                      max_tokens=max_new_tokens, logprobs=None,
                                      generation_kwargs={"stop": list(stop), "include_stop_str_in_output": True})
        return [self._result(ids, "length" if len(ids) >= max_new_tokens else "stop")
                for ids in out["completion_ids"]]

    def _client(self):
        # TRL creates its client (and the weight-sync channel) on the main process only;
        # other ranks only generate, through a plain client of their own.
        client = getattr(self.vg, "vllm_client", None)
        if client is None:
            from trl.generation.vllm_client import VLLMClient

            client = self.vg.vllm_client = VLLMClient(base_url=self.vg.server_base_url)
        return client

    def _result(self, ids, finish: str) -> Generated:
        ids = list(ids)
        if ids and ids[-1] == self.eos:
            ids = ids[:-1]
            return Generated(self.tokenizer.decode(ids, skip_special_tokens=True), ids, "eos")
        return Generated(self.tokenizer.decode(ids, skip_special_tokens=True), ids,
                         "length" if finish == "length" else "stop")
