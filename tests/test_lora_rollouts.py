"""LoRA rollouts with the adapters merged (issue 49): the same tokens as the unmerged adapters,
the adapters merged only while the rollouts run, the weights back where they were afterwards."""

from dataclasses import replace

import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.generation.hf import HFGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.training.modeling import tiny_model
from tests.test_rl import DOCS, P, Q, _tokenizer


def _lora_policy(tok):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = tiny_model(tok, layers=2, hidden=32, heads=2, intermediate=64)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    return get_peft_model(model, cfg)  # random adapters: they change the policy


def _merged(model) -> bool:
    return any(getattr(m, "merged", False) for m in model.modules())


def _lora_layers(model) -> int:
    from peft.tuners.lora import LoraLayer

    return sum(isinstance(m, LoraLayer) for m in model.modules())


def test_merged_lora_rollouts_sample_what_the_unmerged_adapters_sample(tmp_path):
    from r3rag.rl.grpo import build_trainer, generator
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.stages.rl import Config

    tok = _tokenizer()
    model = _lora_policy(tok)
    cfg = Config(steps=1, prompts_per_step=1, num_generations=2, bf16=False, save_steps=0, temperature=0.0)
    trainer = build_trainer(model, tok, [Q], None, P, RewardScorer({"em": 1.0}, RewardSettings(), P), cfg, tmp_path)
    retriever, env = BM25Retriever.build(DOCS), EnvConfig(top_k=1, max_turns=3, max_new_tokens=12)
    questions = [Q, {**Q, "id": "q2", "question": "Where is it and more ?"}]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    plain = run_rollouts(questions, HFGenerator(model, tok, temperature=0.0), retriever, P, env, tok)
    model.train()
    with generator(trainer, tok, replace(cfg, vllm="")) as gen:
        # one plain weight per layer while it generates: the adapters merged in, peft's wrappers out of the way
        assert not _lora_layers(model) and not model.training
        merged = run_rollouts(questions, gen, retriever, P, env, tok)
    assert _lora_layers(model) == 6 and not _merged(model) and model.training  # as they were
    assert [t.turns for t in merged] and [[t.ids for t in r.turns] for r in merged] == [
        [t.ids for t in r.turns] for r in plain
    ]
    assert sum(len(t.ids or []) for r in merged for t in r.turns if t.role == "model") > 10
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=1e-6, msg=k)  # unmerged: float rounding at most
