"""vLLM's CPU build keeps each linear layer's own weight for GRPO's colocated weight sync
(`r3rag.generation.vllm.keep_cpu_weights_loadable`), and its server's reload re-packs the tied LM head
(`r3rag.generation.vllm_server.repack_cpu_lm_head`). Needs vLLM (`make test-vllm`); a tiny model."""

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


def test_the_servers_reload_moves_a_tied_lm_head_too(tmp_path, monkeypatch):
    """rl.vllm=server on the CPU: the gloo engine's start/finish around a sync (vLLM's layerwise
    reload) leave the engine scoring as the synced weights do, the LM head tied to the embedding
    included (vLLM's CPU build packs the head's weight once; the sync carries only the embedding)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-vllm)")
    import torch
    from vllm import SamplingParams

    from r3rag.generation.vllm import EngineSettings, load_llm
    from r3rag.generation.vllm_server import gloo_engine_class
    from r3rag.training.modeling import tiny_model, train_word_tokenizer

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine's model in this process
    tok = train_word_tokenizer(["who wrote the play hamlet ? shakespeare wrote it in london"])
    # head_dim 64: a size vLLM's CPU attention has (16 is not)
    policy = tiny_model(tok, layers=2, hidden=128, heads=2, intermediate=256, max_positions=128)
    policy.save_pretrained(tmp_path), tok.save_pretrained(tmp_path)
    llm = load_llm(str(tmp_path), "float32", EngineSettings(max_model_len=128, cpu_kv_cache_gb=0.25))
    engine_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    engine = gloo_engine_class()(None, llm.llm_engine.vllm_config, torch.device("cpu"), engine_model)
    prompt = tok("who wrote the play hamlet ?")["input_ids"]

    def largest_logprob_gap() -> float:
        """|vLLM's logprob - transformers'| over the top tokens of a greedy continuation."""
        sampled = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": prompt}], sampled)[0].outputs[0]
        with torch.no_grad():
            logits = policy(torch.tensor([prompt + list(out.token_ids)])).logits[0, len(prompt) - 1 : -1]
        ours = torch.log_softmax(logits.float(), -1)
        return max(abs(lp.logprob - ours[i, t].item()) for i, top in enumerate(out.logprobs) for t, lp in top.items())

    assert largest_logprob_gap() < 1e-4  # as loaded
    assert "lm_head.weight" not in dict(policy.named_parameters())  # tied: a sync sends the embedding only
    for step in range(2):
        with torch.no_grad():
            for p in policy.parameters():  # a training step's worth of change, the embedding's included
                p.add_(torch.randn_like(p) * 0.5 * p.std())
        engine.start_weight_update()
        engine_model.load_weights([(n, p.detach().clone()) for n, p in policy.named_parameters()])
        engine.finish_weight_update()
        llm.reset_prefix_cache()
        assert largest_logprob_gap() < 1e-4, f"sync {step + 1}: the engine does not score as the synced weights"
