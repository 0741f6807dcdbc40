"""PPO with a critic, RLOO and REINFORCE++ (issue 46): the estimators against hand computations,
retrieved tokens out of every loss and statistic, the critic's fit, epochs that clip, the KL in the
reward, step-level episodes, a resume that ends where a straight run ends, and bad settings."""

import pytest
import torch

from r3rag.rl.advantages import (
    discounted_returns,
    gae,
    masked_whiten,
    rloo_advantages,
    token_rewards,
    value_loss,
)
from r3rag.rl.grpo import build_trainer, rollout_batch
from r3rag.rl.rewards import RewardScorer, RewardSettings
from r3rag.training.modeling import tiny_model
from r3rag.util.errors import UserError
from tests.test_rl import LOST, RIGHT, P, Q, _rollouts, _tokenizer

# one row: 3 model tokens, 3 retrieved, 2 model tokens, then padding
MASK = torch.tensor([[1, 1, 1, 0, 0, 0, 1, 1, 0, 0]], dtype=torch.float)
MODEL = [0, 1, 2, 6, 7]


def _hand_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Textbook GAE over the model tokens alone, as one unbroken sequence."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        running = rewards[t] + gamma * next_value - values[t] + gamma * lam * running
        out[t] = running
    return out


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.8)])
def test_gae_runs_over_the_model_tokens_only(gamma, lam):
    rewards = torch.zeros_like(MASK)
    rewards[0, 1], rewards[0, 7] = -0.1, 1.0
    values = torch.tensor([[0.3, -0.2, 0.5, 9.0, -7.0, 4.0, 0.1, 0.7, 3.0, 3.0]])
    adv, ret = gae(rewards, values, MASK, gamma, lam)
    hand = _hand_gae([rewards[0, i].item() for i in MODEL], [values[0, i].item() for i in MODEL], gamma, lam)
    assert adv[0, MODEL].tolist() == pytest.approx(hand, abs=1e-6)
    assert ret[0, MODEL].tolist() == pytest.approx([a + values[0, i].item() for a, i in zip(hand, MODEL)], abs=1e-6)
    if gamma == lam == 1.0:  # telescopes: the sum of later rewards minus V
        assert adv[0, 0].item() == pytest.approx(0.9 - 0.3)


def test_values_at_retrieved_tokens_change_no_model_tokens_advantage():
    rewards = torch.zeros_like(MASK)
    rewards[0, 7] = 1.0
    values = torch.rand(1, 10)
    other = values.clone()
    other[0, 3:6] = torch.tensor([100.0, -50.0, 7.0])
    other[0, 8:] = 42.0
    for gamma, lam in ((1.0, 1.0), (0.95, 0.9)):
        a, _ = gae(rewards, values, MASK, gamma, lam)
        b, _ = gae(rewards, other, MASK, gamma, lam)
        assert torch.equal(a[0, MODEL], b[0, MODEL])


def test_whitening_uses_the_model_tokens_only():
    x = torch.tensor([[1.0, 2.0, 3.0, 1000.0, -1000.0, 5.0, 4.0, 5.0, 77.0, 77.0]])
    w = masked_whiten(x, MASK)
    kept = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert w[0, MODEL].tolist() == pytest.approx(((kept - kept.mean()) / kept.std()).tolist(), abs=1e-5)
    assert w[0, [3, 4, 5, 8, 9]].abs().sum() == 0


def test_the_kl_penalty_lowers_each_model_tokens_reward_by_kl_coef_times_k1():
    logp, logp_ref = torch.randn(1, 10), torch.randn(1, 10)
    kl = (logp - logp_ref) * MASK
    base = token_rewards(MASK, torch.tensor([1.0]))
    penalised = token_rewards(MASK, torch.tensor([1.0]), kl=kl, kl_coef=0.01)
    expected = (0.01 * (logp - logp_ref))[0, MODEL].tolist()
    assert (base - penalised)[0, MODEL].tolist() == pytest.approx(expected, abs=1e-6)
    assert (base - penalised)[0, [3, 4, 5, 8, 9]].abs().sum() == 0
    assert base[0, 7] == 1.0 and base.sum() == 1.0  # the outcome on the last model token


def test_step_episodes_do_not_bootstrap_across_steps():
    """ppo_unit=step: tokens 0-2 are step 1 (ends at 2), 6-7 step 2; step 1's advantages see
    only its own reward and values, whatever happens in step 2."""
    ends = torch.zeros_like(MASK)
    ends[0, 2] = 1
    values = torch.tensor([[0.3, -0.2, 0.5, 0, 0, 0, 0.1, 0.7, 0, 0]])
    r = token_rewards(MASK, torch.tensor([1.0]), step_rewards=[[(2, 0.4)]])
    adv, _ = gae(r, values, MASK, 1.0, 1.0, ends)
    assert adv[0, [0, 1, 2]].tolist() == pytest.approx([0.4 - 0.3, 0.4 + 0.2, 0.4 - 0.5])
    assert adv[0, [6, 7]].tolist() == pytest.approx([1.0 - 0.1, 1.0 - 0.7])
    r2 = token_rewards(MASK, torch.tensor([-5.0]), step_rewards=[[(2, 0.4)]])
    v2 = values.clone()
    v2[0, 6:8] = torch.tensor([9.0, -9.0])
    adv2, _ = gae(r2, v2, MASK, 0.9, 0.7, ends)
    adv1, _ = gae(r, values, MASK, 0.9, 0.7, ends)
    assert torch.equal(adv1[0, :3], adv2[0, :3])
    returns = discounted_returns(r, MASK, 1.0, ends)
    assert returns[0, MODEL].tolist() == pytest.approx([0.4, 0.4, 0.4, 1.0, 1.0])


def test_rloo_and_reinforce_pp_against_hand_computations():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 2.0])
    hand = [1 - 0.25, 0 - 0.75, 0.5 - 0.5, 0 - 2.0, 2 - 1.0, 2 - 1.0]
    assert rloo_advantages(rewards, 3).tolist() == pytest.approx(hand)
    with pytest.raises(ValueError):
        rloo_advantages(rewards, 1)
    # REINFORCE++: gamma-discounted returns over model tokens (retrieved carried through), then whitened
    r = torch.zeros(2, 10)
    r[0, 7], r[1, 2] = 1.0, -0.5
    r[:, 1] -= 0.1
    mask = torch.cat([MASK, torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float)])
    returns = discounted_returns(r, mask, gamma=0.5)
    g = 0.5
    row0 = [g**4 * 1 - g * 0.1, g**3 * 1 - 0.1, g**2 * 1, g, 1.0]  # model tokens 0, 1, 2, 6, 7
    assert returns[0, MODEL].tolist() == pytest.approx(row0)
    assert returns[1, :3].tolist() == pytest.approx([-0.1 * g - 0.5 * g**2, -0.1 - 0.5 * g, -0.5])
    flat = torch.tensor(row0 + returns[1, :3].tolist())
    whitened = masked_whiten(returns, mask)
    expected = (flat - flat.mean()) / flat.std()
    assert torch.cat([whitened[0, MODEL], whitened[1, :3]]).tolist() == pytest.approx(expected.tolist(), abs=1e-5)


def test_the_value_loss_has_exactly_zero_gradient_at_retrieved_tokens_and_clips():
    predicted = torch.randn(1, 10, requires_grad=True)
    old, returns = torch.randn(1, 10), torch.randn(1, 10)
    loss, _ = value_loss(predicted, old, returns, MASK, clip=10.0)  # wide: no token clipped, all get gradient
    loss.backward()
    assert torch.all(predicted.grad[0, [3, 4, 5, 8, 9]] == 0) and torch.all(predicted.grad[0, MODEL] != 0)
    far = (old + 1.0).requires_grad_(True)  # every prediction outside the clip range
    returns_far = old + 2.0  # and below its return: the clipped term is the larger loss
    loss, clip_frac = value_loss(far, old, returns_far, MASK, clip=0.2)
    assert clip_frac.item() == 1.0 and loss.item() == pytest.approx(0.5 * 1.8**2)


# ---- through the trainer ---------------------------------------------------------------------


def _trainer(tmp_path, algorithm="ppo", model=None, **kw):
    from r3rag.stages.rl import Config

    tok = _tokenizer()
    trajs = [_rollouts(tok, RIGHT), _rollouts(tok, LOST)]
    scorer = RewardScorer({"em": 1.0}, RewardSettings(), P)
    settings = dict(steps=2, prompts_per_step=1, num_generations=2, bf16=False, save_steps=0, lr=1e-3)
    cfg = Config(**{**settings, "algorithm": algorithm, **kw})
    torch.manual_seed(0)
    model = model or tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64)
    trainer = build_trainer(model, tok, [Q], None, P, scorer, cfg, tmp_path)
    batch = rollout_batch(trajs, tok.eos_token_id, 512, turns=cfg.ppo_unit == "step")
    trainer.rollout_func = _keeping_spans(trainer, lambda p, tr: {**batch, "scores": scorer.score(trajs, [Q, Q])})
    return trainer, batch


def _keeping_spans(trainer, rollout):
    """The scripted rollout under the trainer's own wrapper (which keeps the rows' token spans)."""

    def wrapped(prompts, tr):
        out = {**rollout(prompts, tr), "timing": {}}
        from r3rag.training.trainers import ROW_FIELDS

        trainer.row_extras = {k: out.pop(k) for k in ROW_FIELDS if k in out}
        return out

    return wrapped


def test_a_critic_fits_constant_returns_on_a_fixed_batch(tmp_path):
    from r3rag.rl.advantages import masked_mean
    from r3rag.rl.critic import build_critic, critic_values

    trainer, batch = _trainer(tmp_path, critic_lr=1e-2)
    critic = trainer.critic
    ids = torch.tensor([batch["prompt_ids"][0] + batch["completion_ids"][0]])
    width = len(batch["completion_ids"][0])
    mask = torch.tensor([batch["env_mask"][0]], dtype=torch.float)
    returns = torch.full((1, width), 0.8)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        v = critic_values(critic, ids, torch.ones_like(ids), width)
        loss = 0.5 * masked_mean((v - returns) ** 2, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10
    fresh = build_critic(trainer.model)
    assert fresh.score.out_features == 1 and not hasattr(fresh, "lm_head")


def test_the_policy_loss_has_exactly_zero_gradient_at_retrieved_tokens(tmp_path, monkeypatch):
    trainer, _ = _trainer(tmp_path, steps=1)
    seen = []
    score = trainer._get_per_token_logps_and_entropies

    def leaf_logps(model, input_ids, attention_mask, logits_to_keep, *a, **kw):
        logps, entropy, aux = score(model, input_ids, attention_mask, logits_to_keep, *a, **kw)
        if torch.is_grad_enabled():
            logps = logps.detach().requires_grad_(True)
            seen.append(logps)
        return logps, entropy, aux

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", leaf_logps)
    trainer.current_gradient_accumulation_steps = 1  # set by train(); this calls the loss directly
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer._compute_loss(trainer.model, batch).backward()
    (logps,) = seen
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert torch.all(logps.grad[~mask] == 0) and (~mask).sum() > 10
    assert (logps.grad[mask] != 0).float().mean() > 0.9  # whitened advantages: nearly every model token moves


def test_ppo_trains_policy_and_critic_and_logs_its_lines(tmp_path):
    trainer, _ = _trainer(tmp_path, num_iterations=2, epsilon=0.01, lr=5e-2, critic_lr=1e-2, steps=2)
    policy0 = [p.detach().clone() for p in trainer.model.parameters()]
    critic0 = [p.detach().clone() for p in trainer.critic.parameters()]
    trainer.train()
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert len(rows) == 2
    # epoch 2 over the same rollouts: the ratio has moved off 1 and the clip engages
    assert rows[0]["clip_ratio/region_mean"] == 0 and rows[1]["clip_ratio/region_mean"] > 0
    for key in ("critic/value_loss", "critic/explained_variance", "critic/clip_frac", "advantages/mean"):
        assert key in rows[0], key
    assert any(not torch.equal(a, b) for a, b in zip(policy0, trainer.model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic0, trainer.critic.parameters()))


def test_critic_warmup_steps_leave_the_policy_alone(tmp_path):
    trainer, _ = _trainer(tmp_path, critic_warmup_steps=1, steps=2, critic_lr=1e-2)
    policy0 = [p.detach().clone() for p in trainer.model.parameters()]
    critic0 = [p.detach().clone() for p in trainer.critic.parameters()]
    moved = []
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            moved.append(any(not torch.equal(a, b) for a, b in zip(policy0, trainer.model.parameters())))

    trainer.add_callback(Watch())
    trainer.train()
    assert moved == [False, True]
    assert any(not torch.equal(a, b) for a, b in zip(critic0, trainer.critic.parameters()))


def test_kl_in_the_reward_is_scored_against_the_reference(tmp_path):
    from r3rag.training.modeling import load_model

    tok = _tokenizer()
    tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64).save_pretrained(tmp_path / "m")
    trainer, _ = _trainer(tmp_path, "reinforce_pp", model=load_model(tmp_path / "m"), kl_coef=0.1, lr=5e-2, steps=3)
    assert trainer.ref_model is not None
    trainer.train()
    rows = [r for r in trainer.state.log_history if "kl/k1_mean" in r]
    assert rows[0]["kl/k1_mean"] == pytest.approx(0.0, abs=1e-6)  # the policy starts as its reference
    assert abs(rows[-1]["kl/k1_mean"]) > 1e-4  # and has left it by the second rollout
    assert "kl" not in rows[-1]  # TRL's k3 term stayed out of the loss


def test_ppo_unit_step_marks_each_turn_as_an_episode(tmp_path):
    trainer, batch = _trainer(tmp_path, ppo_unit="step", steps=1)
    trainer.train()
    spans = batch["turn_spans"]
    assert [len(s) for s in spans] == [3, 3]  # three model turns each (search, search, answer / search x3)
    mask = torch.ones(2, max(len(c) for c in batch["completion_ids"]))
    ends = trainer._turn_ends(mask)
    for row, s in enumerate(spans):
        assert ends[row].nonzero().squeeze(1).tolist() == [end - 1 for _, end in s[:-1]]


def test_a_resumed_ppo_run_ends_with_the_straight_runs_policy_and_critic(tmp_path):
    """3 steps straight against 2 steps, a kill after checkpoint-2, and a resume: the same policy,
    the same critic and the same critic optimizer moments."""
    from transformers import TrainerCallback

    class Killed(Exception):
        pass

    class Kill(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if state.global_step == 2:
                raise Killed

    kw = dict(steps=3, save_steps=2, lr=1e-2, critic_lr=1e-2, lr_scheduler="linear", seed=3)
    straight, _ = _trainer(tmp_path / "a", **kw)
    straight.train()
    killed, _ = _trainer(tmp_path / "b", **kw)
    killed.add_callback(Kill())
    with pytest.raises(Killed):
        killed.train()
    for callback in killed.callback_handler.callbacks:  # the killed run's progress bar, left open
        if getattr(callback, "training_bar", None) is not None:
            callback.training_bar.close()
    resumed, _ = _trainer(tmp_path / "b", **kw)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoints" / "checkpoint-2"))
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for a, b in zip(straight.critic.parameters(), resumed.critic.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    sa, sb = straight.critic_optimizer.state_dict()["state"], resumed.critic_optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.allclose(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)


def test_a_lora_policy_gets_a_lora_critic_with_a_whole_head(tmp_path):
    from r3rag.rl.critic import build_critic, trained_parameters
    from r3rag.training.helpers import LoraSettings, apply_lora

    tok = _tokenizer()
    policy = apply_lora(tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64), LoraSettings(r=4))
    critic = build_critic(policy)
    names = list(trained_parameters(critic))
    assert any("lora_A" in n for n in names) and any("score" in n for n in names)
    assert not any("embed_tokens" in n for n in names)
    base = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(critic.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight, base)


# ---- settings ----------------------------------------------------------------------------------


def test_the_algorithm_settings_keep_old_ids_and_bad_ones_are_one_line(tmp_path):
    from r3rag.stages.common import Context
    from r3rag.stages.rl import INPUTS, Config, validate
    from r3rag.util.config import build_config

    ctx = Context(runs_dir=tmp_path)
    base = ctx.writer("rl", Config(), {}, INPUTS).id
    assert ctx.writer("rl", Config(algorithm="grpo", lam=1.0, sample_temperatures=[]), {}, INPUTS).id == base
    for change in ({"algorithm": "ppo"}, {"critic_lr": 3e-6}, {"sample_temperatures": [0.1, 1.0]}):
        assert ctx.writer("rl", Config(**change), {}, INPUTS).id != base, change
    with pytest.raises(UserError, match="allowed: grpo, ppo, rloo, reinforce_pp"):
        build_config(Config, {"algorithm": "trpo"})
    for bad, needle in (
        ({"algorithm": "ppo", "lam": 1.5}, r"rl.lam: expected a number in \[0, 1\]"),
        ({"algorithm": "ppo", "critic_lr": 0.0}, "rl.critic_lr: expected a learning rate above 0"),
        ({"algorithm": "ppo", "dynamic_sampling": True}, "rl.dynamic_sampling: ppo does not compare"),
        ({"algorithm": "ppo", "beta": 0.001}, "set rl.kl_coef instead"),
        ({"algorithm": "rloo", "num_generations": 1}, "needs rl.num_generations >= 2"),
        ({"kl_coef": 0.01}, "GRPO's is rl.beta"),
        ({"ppo_unit": "step"}, "set rl.algorithm=ppo"),
        ({"algorithm": "ppo", "critic_warmup_steps": 20}, "leave none of rl.steps"),
        ({"sample_temperatures": [0.0]}, "expected temperatures above 0"),
    ):
        with pytest.raises(UserError, match=needle) as err:
            validate(Config(**bad))
        assert "\n" not in str(err.value)


def test_samples_of_a_group_cycle_through_the_sample_temperatures(monkeypatch):
    import contextlib

    from r3rag.generation.scripted import ScriptedGenerator
    from r3rag.retrieval.bm25 import BM25Retriever
    from r3rag.rl import grpo
    from r3rag.stages.rl import Config
    from tests.test_rl import DOCS

    tok = _tokenizer()
    used = []

    @contextlib.contextmanager
    def fake_generator(trainer, tokenizer, cfg):
        used.append(cfg.temperature)
        yield ScriptedGenerator(lambda t: f"<answer> {cfg.temperature} </answer>", tok)

    monkeypatch.setattr(grpo, "generator", fake_generator)
    cfg = Config(num_generations=4, sample_temperatures=[0.1, 0.4, 0.7, 1.0], max_turns=2)
    exs = [Q] * 8
    trajs = grpo.rollouts_at_temperatures(
        exs, None, tok, cfg, grpo.Timed(None), BM25Retriever.build(DOCS), P, cfg.env_config(max_completion_tokens=64)
    )
    assert used == [0.1, 0.4, 0.7, 1.0]
    assert [float(t.answer) for t in trajs] == [0.1, 0.4, 0.7, 1.0] * 2


# ---- through the stage -------------------------------------------------------------------------


def test_the_rl_stage_runs_ppo_with_lora_a_kl_penalty_and_the_best_dev_step(pipeline_runs):
    """`r3rag rl --set algorithm=ppo` end to end: a LoRA policy and critic, the KL in the reward
    against the adapters-off reference, dev EM each step, the best step published, checkpoints
    with the critic in them, the critic's lines in metrics.jsonl and the manifest's summary."""
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl

    runs, refs = pipeline_runs
    world = refs["world"].path / "train.jsonl"  # the fixture's world has no dev split: train stands in
    settings = {
        "eval_questions": world,
        "steps": 2,
        "prompts_per_step": 2,
        "num_generations": 2,
        "max_turns": 2,
        "max_new_tokens": 12,
    }
    extra = {"algorithm": "ppo", "lora": "true", "kl_coef": 0.01, "eval_every": 1, "eval_limit": 4}
    extra |= {"keep": "best_dev", "save_steps": 1, "bf16": "false", "name": "ppo", "critic_lr": 1e-3}
    ref = run_stage("rl", None, [f"{k}={v}" for k, v in {**settings, **extra}.items()], runs)
    rows = read_jsonl(ref.path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("critic/value_loss", "critic/explained_variance", "kl/k1_mean", "dev/em", "reward"):
        assert key in rows[0], key
    assert rows[0]["kl/k1_mean"] == pytest.approx(0.0, abs=1e-6)  # step 1 rolls out with the reference itself
    metrics = ref.manifest["metrics"]
    assert "last_critic/value_loss" in metrics and metrics["kept_step"] in (0, 1, 2)
    assert (ref.path / "model" / "model.safetensors").is_file()  # the policy, merged; no critic published
    assert not list(ref.path.rglob("critic.pt"))
