"""vLLM for real: its CPU build (`make test-vllm` installs it and runs exactly these) through every
path a GPU run takes, on SmolLM2-135M-Instruct and real questions; no stand-in.

- eval.backend=vllm against transformers, greedy, on 30 real questions, with a policy that searches
  (SmolLM2 after a short SFT cold start on oracle trajectories): the multi-turn Search-R1 loop,
  documents inserted between turns, stops at </search> / </answer>, the chat template;
- GRPO rl.vllm=colocate: 3 steps; the trained weights reach the engine (exactly, in fp32; its
  greedy output moves and is the trained model's greedy choice under transformers); the rollouts'
  vLLM logprobs against the trainer's recomputed ones;
- GRPO rl.vllm=colocate with rl.context=fold: 2 steps on a row per model turn, vLLM sampling each
  turn from its folded context: its logprobs are the trainer's on every row;
- the env_mask GRPO trains on: the same from vLLM's and transformers' rollouts of the same tokens;
- PPO rl.vllm=colocate: 2 steps; the critic trains, the engine holds the policy's weights only.

Each colocated run trains in a process of its own (`in_own_process`: its engine's memory is freed
with it), its probe's findings sent back to be checked here.

Each skips with one line without vLLM, the [real] extra or the shared data. Minutes each on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from tests.vllm_policy import (  # noqa: F401 (fixtures)
    PIPELINE,
    greedy_choices_off_the_best,
    in_own_process,
    searching_policy,
    vllm_installed,
)

EVAL = ["rl=", "systems=[sft]", "models={}", "compare_to=[]", "max_new_tokens=64", "limit=0"]

# vLLM's CPU build for real: an engine start and SmolLM2 steps, minutes a test.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]


# The eval's engine pool, kept for the env_mask test (next in this file): one engine start fewer
# (~40 s on 2 cores); a test run alone starts its own.
EVAL_ENGINES: list = []


def _eval(runs, refs, *settings):
    from r3rag.experiments.pipeline import run_stage

    pinned = [f"{s}={refs[s].path}" for s in ("world", "index", "sft")]
    ref = run_stage("eval", PIPELINE, [*EVAL, *pinned, *settings], runs)
    return {json.loads(line)["id"]: json.loads(line) for line in (ref.path / "predictions.jsonl").open()}


def test_eval_on_vllm_answers_as_transformers_does(searching_policy, monkeypatch):
    from r3rag.generation.vllm import EnginePool
    from r3rag.stages import eval as eval_stage

    class Kept(EnginePool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            EVAL_ENGINES[:] = [self]

    runs, refs = searching_policy
    hf = _eval(runs, refs, "name=hf", "backend=transformers")
    monkeypatch.setattr(eval_stage, "EnginePool", Kept)
    vllm = _eval(runs, refs, "name=vllm", "backend=vllm")
    assert len(hf) == len(vllm) == 30 and set(hf) == set(vllm)
    for preds in (hf, vllm):  # the loop ran: searches, documents, more turns
        assert sum(p["searches"] for p in preds.values()) / 30 >= 1.0
        assert {p["dataset"] for p in preds.values()} == {"hotpotqa", "musique", "2wikimultihopqa"}
    same_em = [q for q in hf if hf[q]["em"] == vllm[q]["em"]]
    differ = {q: (hf[q]["answer"], vllm[q]["answer"]) for q in hf if hf[q]["answer"] != vllm[q]["answer"]}
    print(f"per-question EM equal on {len(same_em)}/30; answers differ on {len(differ)}: {differ}")
    assert len(same_em) / 30 >= 0.95


def test_env_mask_is_the_same_from_vllm_and_transformers_rollouts(searching_policy):
    from r3rag.core.env import EnvConfig, run_rollouts
    from r3rag.core.protocol import Protocol
    from r3rag.generation.hf import HFGenerator
    from r3rag.generation.vllm import EnginePool, LLMGenerator
    from r3rag.retrieval import open_retriever
    from r3rag.rl.grpo import rollout_batch
    from r3rag.training.helpers import load_protocol_dict
    from r3rag.training.modeling import load_policy
    from r3rag.util.jsonl import read_jsonl

    runs, refs = searching_policy
    policy = refs["sft"].path
    questions = read_jsonl(refs["world"].path / "train.jsonl")[:12]
    protocol = Protocol(**load_protocol_dict(policy))
    retriever = open_retriever("", refs["index"])
    cfg = EnvConfig(top_k=3, max_turns=3, max_new_tokens=48)
    model, tok = load_policy(policy)
    model.eval()
    by_hf = run_rollouts(questions, HFGenerator(model, tok, batch_size=12), retriever, protocol, cfg, tok)
    llm = (EVAL_ENGINES.pop() if EVAL_ENGINES else EnginePool()).get(str(policy / "model"), "float32")
    by_vllm = run_rollouts(questions, LLMGenerator(llm, tok), retriever, protocol, cfg, tok)
    hf = rollout_batch(by_hf, tok.eos_token_id, 640)
    vl = rollout_batch(by_vllm, tok.eos_token_id, 640)
    same = [i for i in range(len(questions)) if hf["completion_ids"][i] == vl["completion_ids"][i]]
    assert len(same) >= len(questions) // 2  # greedy on both: most trajectories are the same tokens
    assert any(0 in hf["env_mask"][i] for i in same)  # ...and some of them hold retrieved documents
    for i in same:
        assert hf["env_mask"][i] == vl["env_mask"][i]


def _greedy(llm, prompt_ids: list[int], n: int) -> list[int]:
    from r3rag.generation.vllm import sample

    ((ids, _, _),) = sample(llm, [prompt_ids], (), n, temperature=0.0, top_p=1.0)
    return ids


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _engine_weight_gap(llm, model) -> tuple[int, float]:
    """(tensors compared, largest |engine - trainer|) over every weight the engine holds; vLLM fuses
    q/k/v and gate/up into one tensor each, the trainer's are stacked to match."""
    import torch

    engine = llm.llm_engine.model_executor.driver_worker.model_runner.model.named_parameters()
    ours = dict(model.named_parameters())
    gaps = []
    for name, weight in engine:
        fused = next(((f, parts) for f, parts in FUSED.items() if f".{f}." in name), None)
        expected = torch.cat([ours[name.replace(fused[0], p)] for p in fused[1]]) if fused else ours[name]
        gaps.append((weight.detach().float() - expected.detach().float()).abs().max().item())
    return len(gaps), max(gaps)


def _grpo_colocate(runs, policy) -> tuple[str, dict]:
    """3 GRPO steps with rl.vllm=colocate (in its own process): the run's path and what the probe saw
    of the engine: its greedy answer before training and after the last sync, its weights' gap."""
    from transformers import TrainerCallback

    from r3rag.experiments.pipeline import run_stage
    from r3rag.stages import rl as rl_stage

    seen: dict = {}
    build = rl_stage._trainer

    def probed(cfg, model, tokenizer, *rest):
        trainer = build(cfg, model, tokenizer, *rest)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Who wrote Hamlet?"}], add_generation_prompt=True, tokenize=True
        )
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)

        class Probe(TrainerCallback):  # the engine's greedy answer before training and after the last sync
            def on_train_begin(self, args, state, control, **kw):
                seen["before"] = _greedy(trainer.vllm_generation.llm, prompt, 16)

            def on_train_end(self, args, state, control, **kw):
                trainer.vllm_generation.sync_weights()  # as TRL does before each generation
                seen["after"] = _greedy(trainer.vllm_generation.llm, prompt, 16)
                seen["weights"] = _engine_weight_gap(trainer.vllm_generation.llm, trainer.model)
                seen["prompt"] = prompt

        trainer.add_callback(Probe())
        return trainer

    rl_stage._trainer = probed  # this process ends with the run
    settings = ["steps=3", "prompts_per_step=2", "num_generations=4", "grad_accum=1", "max_new_tokens=48"]
    settings += ["max_turns=2", "max_completion_tokens=640", "save_steps=0", "lr=2e-4"]
    # the entropy bonus: a gradient at every step, even one whose rewards are all equal (no GRPO signal)
    settings += [
        "entropy_coef=0.01",
        "rewards={em: 1.0, format: 0.5}",
        "vllm=colocate",
        f"policy={policy}",
        "name=colocate",
    ]
    return str(run_stage("rl", PIPELINE, settings, runs).path), seen


def test_grpo_colocate_trains_and_the_weights_reach_vllm(searching_policy):
    from pathlib import Path

    from r3rag.training.modeling import load_model

    runs, refs = searching_policy
    path, seen = in_own_process(_grpo_colocate, runs, refs["sft"].path)
    path = Path(path)
    steps = [json.loads(line) for line in (path / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    before = load_model(refs["sft"].path / "model", dtype="float32").state_dict()
    after = load_model(path / "model", dtype="float32").state_dict()
    assert any((before[k] - after[k]).abs().max() > 0 for k in before)  # a step had a gradient
    compared, gap = seen["weights"]
    assert compared > 100 and gap == 0.0  # the engine holds the trainer's weights, fp32 as they are
    assert seen["after"] != seen["before"]  # ...and generates with them: its greedy output moved
    # and is the trained model's greedy choice at every token, scored by transformers in fp32 (at
    # a near tie either kernel may take either token: a tolerance, not token equality)
    off = greedy_choices_off_the_best(load_model(path / "model", dtype="float32"), seen["prompt"], seen["after"])
    print(f"vLLM's greedy tokens below transformers' best (nats): {[round(o, 5) for o in off]}")
    assert max(off) < 1e-3
    diffs = [(s["sampling/sampling_logp_difference/mean"], s["sampling/sampling_logp_difference/max"]) for s in steps]
    print(f"|vLLM logprob - trainer logprob| per step (mean, max): {diffs}")
    assert all(mean < 0.1 for mean, _ in diffs)


def _grpo_colocate_fold(runs, policy) -> tuple[str, dict]:
    """2 GRPO steps with rl.vllm=colocate and rl.context=fold (in its own process): the run's path
    and, per step, the rows TRL's loss saw against the trajectories they came from."""
    from r3rag.experiments.pipeline import run_stage
    from r3rag.stages import rl as rl_stage

    seen: dict = {"rows": [], "trajectories": [], "ratio_shapes": []}
    build = rl_stage._trainer

    def probed(cfg, model, tokenizer, *rest):
        trainer = build(cfg, model, tokenizer, *rest)
        compute = trainer._compute_loss

        def recorded(m, inputs):  # each mini-batch of rows TRL's loss weighs (vLLM's ratio per row)
            real = inputs["row_of"] >= 0
            seen["rows"].append(int(real.sum()))
            seen["trajectories"].append(len(set(inputs["row_of"][real].tolist())))
            seen["ratio_shapes"].append(list(inputs["importance_sampling_ratio"].shape))
            return compute(m, inputs)

        trainer._compute_loss = recorded
        return trainer

    rl_stage._trainer = probed  # this process ends with the run
    settings = ["steps=2", "prompts_per_step=2", "num_generations=4", "grad_accum=1", "max_new_tokens=48"]
    settings += ["max_turns=3", "max_completion_tokens=640", "save_steps=0", "lr=2e-4", "entropy_coef=0.01"]
    settings += ["context=fold", "vllm=colocate", f"policy={policy}", "name=colocate-fold"]
    return str(run_stage("rl", PIPELINE, settings, runs).path), seen


def test_grpo_colocate_trains_on_folded_rows_with_vllms_logprobs(searching_policy):
    """rl.context=fold with rl.vllm=colocate: each model turn a row of its own, its context the one
    vLLM sampled it from (the rows' sampling/* lines, every row's, show vLLM's logprobs are the
    trainer's there), TRL's correction per row, and the policy moves."""
    from pathlib import Path

    from r3rag.training.modeling import load_model

    runs, refs = searching_policy
    path, seen = in_own_process(_grpo_colocate_fold, runs, refs["sft"].path)
    steps = [json.loads(line) for line in (Path(path) / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2]
    assert sum(seen["rows"]) > sum(seen["trajectories"])  # the policy searched: more rows than trajectories
    assert all(shape[1] == 1 for shape in seen["ratio_shapes"])  # TRL's default sequence_mask: one ratio a row
    diffs = [(s["sampling/sampling_logp_difference/mean"], s["sampling/sampling_logp_difference/max"]) for s in steps]
    print(f"|vLLM logprob - trainer logprob| over every row per step (mean, max): {diffs}")
    assert all(mean < 0.1 for mean, _ in diffs)
    before = load_model(refs["sft"].path / "model", dtype="float32").state_dict()
    after = load_model(Path(path) / "model", dtype="float32").state_dict()
    assert any((before[k] - after[k]).abs().max() > 0 for k in before)


def _ppo_colocate(runs, policy) -> tuple[str, dict]:
    """2 PPO steps with rl.vllm=colocate (in its own process): the run's path, the engine's weights'
    gap to the policy after the last sync, and whether the critic's optimizer took a step."""
    from transformers import TrainerCallback

    from r3rag.experiments.pipeline import run_stage
    from r3rag.stages import rl as rl_stage

    seen: dict = {}
    build = rl_stage._trainer

    def probed(cfg, model, tokenizer, *rest):
        trainer = build(cfg, model, tokenizer, *rest)

        class Probe(TrainerCallback):
            def on_train_end(self, args, state, control, **kw):
                trainer.vllm_generation.sync_weights()
                seen["weights"] = _engine_weight_gap(trainer.vllm_generation.llm, trainer.model)
                seen["critic_moved"] = trainer.critic_optimizer.state_dict()["state"] != {}

        trainer.add_callback(Probe())
        return trainer

    rl_stage._trainer = probed  # this process ends with the run
    settings = ["steps=2", "prompts_per_step=2", "num_generations=2", "max_new_tokens=32", "max_turns=2"]
    settings += ["max_completion_tokens=512", "save_steps=0", "lr=2e-4", "critic_lr=1e-4", "algorithm=ppo"]
    settings += ["vllm=colocate", f"policy={policy}", "name=ppo"]
    return str(run_stage("rl", PIPELINE, settings, runs).path), seen


def test_ppo_colocate_trains_policy_and_critic_and_only_the_policy_reaches_vllm(searching_policy):
    """rl.algorithm=ppo with rl.vllm=colocate: 2 steps on SmolLM2; the critic (a second SmolLM2
    backbone with a value head) trains beside the policy, vLLM's logprobs stay the trainer's, and the
    engine holds the policy's weights, never the critic's."""
    from pathlib import Path

    runs, refs = searching_policy
    path, seen = in_own_process(_ppo_colocate, runs, refs["sft"].path)
    steps = [json.loads(line) for line in (Path(path) / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all("critic/value_loss" in s and "critic/explained_variance" in s for s in steps)
    assert seen["critic_moved"]
    compared, gap = seen["weights"]
    assert compared > 100 and gap == 0.0  # every engine weight is the policy's (the critic has no lm_head)
    assert all(s["sampling/sampling_logp_difference/mean"] < 0.1 for s in steps)
