"""vLLM's CPU build keeps each linear layer's own weight for GRPO's colocated weight sync
(`r3rag.generation.vllm.keep_cpu_weights_loadable`). Needs vLLM (`make test-vllm`); no model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_linear_layers_keep_their_loadable_weight_and_multiply_with_what_was_synced(monkeypatch):
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    import torch
    from vllm.model_executor.layers import utils

    from r3rag.generation.vllm import keep_cpu_weights_loadable

    monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", utils.dispatch_cpu_unquantized_gemm)  # undone after
    packed = utils.dispatch_cpu_unquantized_gemm
    keep_cpu_weights_loadable()
    keep_cpu_weights_loadable()  # twice (a second trainer in the process): wrapped once
    assert utils.dispatch_cpu_unquantized_gemm is not packed and utils.dispatch_cpu_unquantized_gemm.keeps_weights

    layer = torch.nn.Linear(64, 32, bias=False)
    layer.weight.weight_loader = lambda param, loaded: param.data.copy_(loaded)  # as vLLM's layers carry one
    weight = layer.weight
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)  # what a layer does once loaded
    assert layer.weight is weight and hasattr(layer.weight, "weight_loader")

    synced = torch.randn(32, 64)
    layer.weight.weight_loader(layer.weight, synced)  # TRL's sync, through the layer's loader
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ synced.T, atol=1e-5)
