"""GRPO that keeps learning (issue 17): the anti-collapse settings reach TRL, DAPO's dynamic
sampling drops flat groups and refills them, and per-step credit puts each search step's relevance
on that step's tokens (documents still masked). Evaluating on dev during training and publishing
the best step: tests/test_rl_dev_eval.py."""

import contextlib
import json

import pytest
import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.core.protocol import Protocol
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.rl.grpo import dynamic_sample, rollout_batch, step_spans
from r3rag.rl.rewards import RewardScorer, RewardSettings
from r3rag.training.modeling import tiny_model, train_word_tokenizer
from r3rag.training.trainers import step_advantages
from r3rag.util.errors import UserError
from tests.grad_helpers import keep_final_hidden

DOCS = [
    {"id": "p1", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs ."},
    {"id": "c1", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar ."},
]
P = Protocol(template="minimal", doc_style="plain")
Q = {
    "id": "q",
    "question": "Where is it ?",
    "golden_answers": ["Velmar"],
    "metadata": {"supporting_docs": ["p1", "c1"]},
}
RIGHT = [
    "<search> Ava Smith works </search>",
    "<search> Zentro Labs headquartered </search>",
    "<answer> Velmar </answer>",
]
LOST = ["<search> Ava Smith works </search>", "<search> Ava Smith </search>", "<search> Smith </search>"]


def _tokenizer():
    return train_word_tokenizer([d["text"] for d in DOCS] + ["Question : Where is it ? and more words", "<eos>"])


def _rollout(tok, script):
    gen = ScriptedGenerator(lambda t: script[t.model_turn_count()], tok)
    return run_rollouts([Q], gen, BM25Retriever.build(DOCS), P, EnvConfig(top_k=1, max_turns=3), tok)[0]


def _config(**kw):
    from r3rag.stages.rl import Config

    return Config(
        **{"steps": 1, "prompts_per_step": 1, "num_generations": 2, "bf16": False, "save_steps": 0, "vllm": "", **kw}
    )


# ---- 1. settings against flat or collapsing GRPO reach TRL -----------------------------------


def test_clip_higher_kl_and_loss_normalisation_reach_trls_config(tmp_path):
    from r3rag.rl.grpo import build_trainer
    from r3rag.training.modeling import load_model

    tok = _tokenizer()
    tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64).save_pretrained(tmp_path / "m")
    cfg = _config(epsilon=0.2, epsilon_high=0.28, beta=0.001, loss_type="dr_grpo", scale_rewards="none")
    scorer = RewardScorer({"em": 1.0}, RewardSettings(relevance="gold"), P)
    # beta > 0: TRL loads a reference model from the policy's path (as the stage's policies have)
    trainer = build_trainer(load_model(tmp_path / "m"), tok, [Q], None, P, scorer, cfg, tmp_path)
    assert (trainer.args.epsilon, trainer.args.epsilon_high) == (0.2, 0.28)
    assert (trainer.epsilon_low, trainer.epsilon_high) == (0.2, 0.28)  # what TRL's loss clips with
    assert trainer.args.beta == trainer.beta == 0.001 and trainer.ref_model is not None  # beta > 0: a reference
    assert trainer.args.loss_type == trainer.loss_type == "dr_grpo"
    assert trainer.args.scale_rewards == trainer.scale_rewards == "none"
    default = build_trainer(
        tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64),
        tok,
        [Q],
        None,
        P,
        scorer,
        _config(),
        tmp_path / "d",
    )
    assert default.epsilon_high == default.epsilon_low == 0.2  # None: TRL's symmetric clip


def test_the_new_settings_are_in_the_artifact_hash_and_checked(tmp_path):
    from r3rag.stages.common import Context
    from r3rag.stages.rl import INPUTS, Config, validate
    from r3rag.util.config import build_config

    ctx = Context(runs_dir=tmp_path)
    base = ctx.writer("rl", Config(), {}, INPUTS).id
    for change in (
        {"epsilon_high": 0.28},
        {"dynamic_sampling": True},
        {"dynamic_sampling_rounds": 2},
        {"process_credit": "step"},
        {"eval_every": 5},
        {"eval_limit": 50},
        {"keep": "best_dev"},
        {"scale_rewards": "none"},
        {"loss_type": "dr_grpo"},
    ):
        assert ctx.writer("rl", Config(**change), {}, INPUTS).id != base, change
    for bad, needle in (
        (("keep", "best"), "allowed: last, best_dev"),
        (("scale_rewards", "std"), "allowed: group"),
        (("process_credit", "turn"), "allowed: trajectory, step"),
    ):
        with pytest.raises(UserError, match=needle):
            build_config(Config, {bad[0]: bad[1]})
    for cfg, needle in (
        (Config(keep="best_dev"), "set rl.eval_every"),
        (Config(epsilon_high=0.1), "rl.epsilon_high: expected at least"),
        (Config(process_credit="step", loss_type="vespo"), "weighs whole sequences"),
        (Config(eval_every=-1), "rl.eval_every: expected 0 or more"),
        (Config(save_steps=-1), "rl.save_steps: expected 0 .no checkpoints."),
    ):
        with pytest.raises(UserError, match=needle):
            validate(cfg)
    with pytest.raises(UserError, match="positive weight"):
        RewardScorer({"em": 1.0}, RewardSettings(relevance="gold"), P, step_credit=True)


# ---- 2. DAPO dynamic sampling ----------------------------------------------------------------


def _fixed_roll(flat: set[str]):
    """Rollouts scored by a fixed rule: the questions in `flat` score 0 in every sample, the
    others 0 and 1 alternately (a group with signal). Records every question rolled out."""
    seen = []

    def roll(exs):
        seen.extend(e["id"] for e in exs)
        rows = [{"em": 0.0 if e["id"] in flat else float(i % 2)} for i, e in enumerate(exs)]
        return exs, [f"traj-{e['id']}" for e in exs], rows, [[] for _ in exs]

    return roll, seen


def _signal(part):
    return len({r["em"] for r in part[2]}) > 1


def test_dynamic_sampling_drops_flat_groups_and_refills_from_new_questions():
    from r3rag.rl.grpo import fresh_questions

    pool = [{"id": f"q{i}"} for i in range(8)]
    roll, seen = _fixed_roll(flat={"q0", "q2", "q3", "q5"})
    batch = [pool[0], pool[0], pool[1], pool[1]]  # two groups of 2: q0 (flat) and q1
    (examples, trajs, rows, _), stats = dynamic_sample(
        batch, 2, roll, fresh_questions(pool, batch, 0, 0, 0), _signal, max_rounds=8
    )
    groups = [examples[i]["id"] for i in range(0, 4, 2)]
    assert len(examples) == len(trajs) == len(rows) == 4 and examples[0] == examples[1] and examples[2] == examples[3]
    assert "q0" not in groups and "q1" in groups  # the flat group went, the other stayed
    assert all(_signal((None, None, rows[i : i + 2])) for i in range(0, 4, 2))  # every group has an advantage
    assert stats["dropped_groups"] >= 1 and stats["refill_rounds"] >= 1 and stats["flat_groups"] == 0
    refills = seen[4:]
    assert refills and not set(refills) & {"q0", "q1"}  # refills are new questions, G copies each
    assert all(refills[i] == refills[i + 1] for i in range(0, len(refills), 2))
    assert trajs == [f"traj-{e['id']}" for e in examples]  # the lists stay parallel


def test_dynamic_sampling_stops_at_the_round_cap_and_fills_with_flat_groups():
    from r3rag.rl.grpo import fresh_questions

    pool = [{"id": f"q{i}"} for i in range(10)]
    roll, seen = _fixed_roll(flat={p["id"] for p in pool})
    batch = [pool[0]] * 2 + [pool[1]] * 2
    (examples, _, rows, _), stats = dynamic_sample(
        batch, 2, roll, fresh_questions(pool, batch, 0, 0, 0), _signal, max_rounds=2
    )
    assert len(examples) == 4 and stats == {"dropped_groups": 6, "refill_rounds": 2, "flat_groups": 2}
    assert len(seen) == 4 + 2 * 2 * 2  # the batch, then two rounds of two fresh groups: no more
    (_, _, _, _), off = dynamic_sample(batch, 2, roll, fresh_questions(pool, batch, 0, 0, 0), _signal, max_rounds=0)
    assert off["refill_rounds"] == 0


def test_the_rollout_func_refills_flat_groups_with_fresh_questions_and_their_prompts(monkeypatch):
    """Through `make_rollout_func` with a scripted policy: a question it always gets wrong is a
    flat group and is replaced; TRL gets the refilled questions' prompt ids, and the counts
    reach the logged rollout statistics."""
    from types import SimpleNamespace

    from r3rag.rl import grpo
    from r3rag.rl.rewards import rollout_stats

    tok = _tokenizer()
    questions = [{**Q, "id": f"q{i}", "question": f"Where is it ? {'and more words ' * i}".strip()} for i in range(4)]
    answers = {q["question"]: "Velmar" if q["id"] != "q0" else "Dunmore" for q in questions}
    calls = []

    def script(t):  # q0 always wrong; the others right on every other trajectory: a group with signal
        calls.append(t.id)
        return f"<answer> {answers[t.question] if len(calls) % 2 else 'Dunmore'} </answer>"

    monkeypatch.setattr(grpo, "generator", lambda *a: contextlib.nullcontext(ScriptedGenerator(script, tok)))
    scorer = RewardScorer({"em": 1.0}, RewardSettings(relevance="gold"), P)
    cfg = _config(prompts_per_step=2, dynamic_sampling=True, dynamic_sampling_rounds=3)
    rollout = grpo.make_rollout_func(questions, None, P, tok, scorer, cfg)
    prompts = [P.context_prompt(questions[i]["question"], tok) for i in (0, 0, 1, 1)]
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), accelerator=SimpleNamespace(process_index=0))
    out = rollout(prompts, trainer)
    kept = [json.dumps(p) for p in out["prompt_ids"]]
    ems = [s["em"] for s in out["scores"]]
    assert len(kept) == 4 and kept[0] == kept[1] and kept[2] == kept[3]
    q0_ids = json.dumps(tok.encode(prompts[0], add_special_tokens=False))
    assert q0_ids not in kept  # the flat group is gone
    assert ems[0] != ems[1] and ems[2] != ems[3]
    stats = rollout_stats(
        {"finish_reason": out["finish_reason"], "num_searches": out["num_searches"], "sampling": [out["sampling"]]}
    )
    assert stats["rollout/dropped_groups"] == 1 and stats["rollout/refill_rounds"] == 1
    with pytest.raises(RuntimeError, match="whole groups"):
        rollout(prompts[1:] + prompts[:1], trainer)


# ---- 3. per-step credit for the process reward -----------------------------------------------


def test_process_steps_belong_to_the_turn_that_searched():
    tok = _tokenizer()
    right, lost = _rollout(tok, RIGHT), _rollout(tok, LOST)
    scorer = RewardScorer({"em": 1.0, "relevance": 0.5}, RewardSettings(relevance="gold"), P, step_credit=True)
    rows, steps = scorer.score_steps([right, lost], [Q, Q])
    assert [t.role for t in right.turns] == ["model", "env", "model", "env", "model"]
    assert steps[0] == [[0, 0.5], [2, 0.5]]  # both searches found a new gold document
    assert steps[1] == [[0, 0.5], [2, 0.0]]  # the second found the same one again (the third got no documents)
    assert rows[0]["relevance"] == 1.0 and scorer.trl_weights()["relevance"] == 0.0  # logged, not folded in
    r3 = RewardScorer({"r3rag": 1.0, "em": 0.0}, RewardSettings(relevance="gold"), P, step_credit=True)
    rows, steps = r3.score_steps([right], [Q])
    assert steps[0] == [[0, 1.6], [2, 1.6]] and rows[0]["r3rag_outcome"] == 2.0  # R3-RAG's right-answer steps
    assert r3.trl_weights() == {"em": 0.0, "f1": 0.0, "cover": 0.0, "format": 0.0, "r3rag": 0.0, "r3rag_outcome": 1.0}


def test_step_spans_cover_exactly_the_search_turns_tokens():
    tok = _tokenizer()
    right = _rollout(tok, RIGHT)
    batch = rollout_batch([right], tok.eos_token_id, 512, steps=[[[0, 1.0], [2, 0.25]]])
    (spans,), (mask,) = batch["step_credit"], batch["env_mask"]
    n0, n1, n2 = (len(right.turns[i].ids) for i in range(3))
    assert spans == [[0, n0, 1.0], [n0 + n1, n0 + n1 + n2, 0.25]]
    for start, end, _ in spans:
        assert set(mask[start:end]) == {1}  # model tokens only
    assert step_spans(right, [[2, 1.0]], n0 + n1 + 2) == [[n0 + n1, n0 + n1 + 1, 1.0]]  # cut by the budget (EOS last)


def test_step_advantages_are_normalised_within_each_group():
    spans = [
        [[0, 2, 1.0], [2, 4, 1.0]],
        [[0, 2, 1.0], [3, 4, 0.0], [4, 5, 0.0]],  # group 1: steps 1 1 | 1 0 0
        [[0, 1, 0.5]],
        [[0, 1, 0.5]],
    ]  # group 2: all equal, no advantage
    adv = step_advantages(spans, 6, group=2, weight=1.0, scale="group")
    hi, lo = (1 - 0.6) / (0.3**0.5 + 1e-4), (0 - 0.6) / (0.3**0.5 + 1e-4)
    torch.testing.assert_close(adv[0], torch.tensor([hi, hi, hi, hi, 0, 0]))
    torch.testing.assert_close(adv[1], torch.tensor([hi, hi, 0, lo, lo, 0]))
    assert adv[2:].abs().sum() == 0
    raw = step_advantages([[[0, 1, 2.0]], [[0, 1, 0.0]]], 2, group=2, weight=2.0, scale="none")
    torch.testing.assert_close(raw, torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))  # x - mean: weights kept as given
    twice = step_advantages(spans, 6, group=2, weight=2.0, scale="group")
    torch.testing.assert_close(twice, 2 * adv, rtol=1e-3, atol=1e-6)  # W sets the process's share next to the outcome


def test_step_credit_through_trl_gives_each_search_its_relevance_and_masks_the_documents(tmp_path):
    """Through TRL's GRPOTrainer (relying on its internal `_generate_and_score_completions`
    returning `advantages` of shape (B,), and on `_compute_loss` taking (B, T)): the
    advantage on a search turn's tokens is the trajectory's (EM) plus that step's normalised
    relevance, the answer turn keeps the trajectory's, and the documents get exactly zero
    gradient whatever their advantage."""
    from trl import GRPOTrainer

    from r3rag.rl.grpo import build_trainer

    assert hasattr(GRPOTrainer, "_generate_and_score_completions")  # the internal R3ragGRPOTrainer extends
    tok = _tokenizer()
    trajs = [_rollout(tok, RIGHT), _rollout(tok, LOST)]
    scorer = RewardScorer({"em": 1.0, "relevance": 1.0}, RewardSettings(relevance="gold"), P, step_credit=True)
    cfg = _config(process_credit="step", lr=1e-3)
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64)
    trainer = build_trainer(model, tok, [Q], None, P, scorer, cfg, tmp_path)
    rows, steps = scorer.score_steps(trajs, [Q, Q])
    batch = rollout_batch(trajs, tok.eos_token_id, 512, steps=steps)
    trainer.rollout_func = lambda prompts, tr: {
        **{k: v for k, v in batch.items() if k != "step_credit"},
        "scores": rows,
        "timing": {},
    }
    trainer.row_extras = {"step_credit": batch["step_credit"]}  # what the wrapped rollout_func keeps for the advantages
    seen = []
    compute = trainer._compute_loss
    trainer._compute_loss = lambda m, inputs: seen.append(inputs) or compute(m, inputs)
    captured = keep_final_hidden(model)
    trainer.train()
    (inputs,), (hidden,) = seen, captured
    adv, tool_mask, ids = inputs["advantages"], inputs["tool_mask"], inputs["completion_ids"]
    assert adv.dim() == 2
    traj_adv = 0.5 / (0.5**0.5 + 1e-4)  # EM 1 vs 0: (r - mean) / (std + eps)
    hi, lo = (1 - 0.75) / (0.5 + 1e-4), (0 - 0.75) / (0.5 + 1e-4)  # relevance 1 1 | 1 0 over the group's steps
    credited = [{0: hi, 2: hi}, {0: hi, 2: lo}]  # model turn -> its step's advantage (LOST's 3rd: no documents)
    n_prompt = len(trajs[0].prompt_ids)
    grad = hidden.grad.abs().sum(-1)
    for i, (traj, base) in enumerate(zip(trajs, (traj_adv, -traj_adv))):
        want = torch.tensor(batch["completion_ids"][i])
        (row,) = [r for r in range(len(ids)) if torch.equal(ids[r, : len(want)], want)]  # TRL shuffles the rows
        starts = [sum(len(t.ids) for t in traj.turns[:k]) for k in range(len(traj.turns) + 1)]
        for k, t in enumerate(traj.turns):
            span = slice(starts[k], starts[k + 1])
            if t.role == "model":  # a search step: the trajectory's advantage plus its own; the rest: the trajectory's
                expect = base + credited[i].get(k, 0.0)
                torch.testing.assert_close(
                    adv[row, span], torch.full_like(adv[row, span], expect), rtol=1e-4, atol=1e-4
                )
            else:
                assert tool_mask[row, span].sum() == 0  # documents: no loss...
                g = grad[row, n_prompt - 1 + starts[k] : n_prompt - 1 + starts[k + 1]]
                assert torch.all(g == 0)  # ...and exactly no gradient
        assert torch.all(grad[row, n_prompt - 1 : n_prompt - 1 + starts[1]] > 0)  # the first search learns
    assert len(credited[1]) < sum(t.role == "model" for t in trajs[1].turns)  # an uncredited search was checked
