"""GRPO correctness: a length limit is a format error, rollouts run without dropout, the sampled
tokens' logprobs reach TRL aligned with the completion, and a resumed run equals a straight one."""

import dataclasses

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from r3rag.core.env import EnvConfig, Generated, Trajectory, Turn, new_trajectory, run_rollouts
from r3rag.core.protocol import TAGS, Protocol
from r3rag.generation.hf import HFGenerator
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.rl.grpo import completion_logprobs, rollout_batch
from r3rag.rl.rewards import RewardScorer, RewardSettings
from r3rag.training.helpers import LoraSettings, apply_lora, completion_with_eos
from r3rag.training.modeling import tiny_model, train_word_tokenizer

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
SEARCH = "<search> Ava Smith works </search>"


def _tokenizer():
    return train_word_tokenizer([d["text"] for d in DOCS] + ["Question : Where is it ? and more words", "<eos>"])


def _rollout(tok, script, **env):
    gen = ScriptedGenerator(lambda t: script[t.model_turn_count()], tok)
    cfg = EnvConfig(**{"top_k": 1, "max_turns": 3, "max_new_tokens": 8, **env})
    return run_rollouts([Q], gen, BM25Retriever.build(DOCS), P, cfg, tok)[0]


# ---- 1. a length limit is a format error -----------------------------------------------------


def test_a_rollout_cut_by_a_length_limit_is_scored_like_an_invalid_one():
    """A turn out of max_new_tokens, or documents past max_completion_tokens, ends the trajectory
    with finish_reason "length": every component scores it as the malformed trajectory it is
    (format 0, Search-R1's format 0, R3-RAG's -0.9 step), never as "no answer" (R3-RAG's 0.9 rel)."""
    tok = _tokenizer()
    cut_turn = _rollout(tok, [SEARCH, "<search> Zentro Labs is headquartered in Velmar and more words"])
    over_budget = _rollout(tok, [SEARCH], max_completion_tokens=12)
    invalid = _rollout(tok, [SEARCH, "<search> Zentro Labs"])
    assert [t.finish_reason for t in (cut_turn, over_budget, invalid)] == ["length", "length", "invalid"]
    assert cut_turn.turns[-1].ids and len(cut_turn.turns[-1].ids) == 8  # it really ran out of tokens
    weights = {"em": 1.0, "format": 0.1, "search_r1_format": 0.0, "r3rag": 0.0}
    rows = RewardScorer(weights, RewardSettings(relevance="gold"), P).score([cut_turn, over_budget, invalid], [Q] * 3)
    for row in rows:
        assert row["format"] == 0.0 and row["search_r1_format"] == 0.0 and row["em"] == 0.0
        assert row["r3rag"] == pytest.approx((1.0 - 0.9) / 2)  # the gold search, then the format error
    assert rows[0] == rows[1] == rows[2]


# ---- 2. no dropout in rollouts ---------------------------------------------------------------


def test_rollouts_run_in_eval_mode_and_training_keeps_lora_dropout(tmp_path):
    """The rollout generator puts the policy in eval mode (LoRA dropout off: greedy rollouts are
    deterministic, logits repeat) and gives it back in training mode, where dropout still acts."""
    from r3rag.rl.grpo import build_trainer, generator
    from r3rag.stages.rl import Config

    tok = _tokenizer()
    model = apply_lora(
        tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64),
        LoraSettings(r=4, alpha=8, dropout=0.5, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    for name, p in model.named_parameters():  # LoRA B starts at 0: give the adapters an effect to drop
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    scorer = RewardScorer({"em": 1.0}, RewardSettings(relevance="gold"), P)
    cfg = Config(steps=1, prompts_per_step=1, num_generations=2, bf16=False, save_steps=0, vllm="")
    trainer = build_trainer(model, tok, [Q], None, P, scorer, cfg, tmp_path)
    model.train()
    ids = torch.tensor([new_trajectory(Q, P, tok).prompt_ids])
    with generator(trainer, tok, dataclasses.replace(cfg, temperature=0.0)) as gen:  # greedy: comparable
        assert not model.training and not any(m.training for m in model.modules())
        assert torch.equal(model(ids).logits, model(ids).logits)
        trajs = [new_trajectory(Q, P, tok) for _ in range(2)]
        first, second = (gen.generate([t], P.stop_strings(), 12)[0] for t in trajs)
        assert first.ids == second.ids
    assert model.training
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, model(ids).logits)  # training mode: dropout is on


# ---- 4. the sampled tokens' logprobs -----------------------------------------------------------


class _Steer:
    """Makes a random model write `<search> w w </search>` turns: the tags forced, the words sampled
    from the model with the tags and special tokens banned. Reset at each generate call."""

    def __init__(self, tok):
        self.banned = sorted(set(tok.convert_tokens_to_ids(list(TAGS))) | set(tok.all_special_ids))
        self.open, self.close = tok.convert_tokens_to_ids(["<search>", "</search>"])
        self.start = None

    def ban(self, scores):
        scores = scores.clone()
        scores[..., self.banned] = float("-inf")
        return scores

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        pos = input_ids.shape[1] - self.start
        if pos in (0, 3):
            forced = torch.full_like(scores, float("-inf"))
            forced[:, self.open if pos == 0 else self.close] = 0.0
            return forced
        return self.ban(scores)


class _SteeredGenerator(HFGenerator):
    def _generate_batch(self, *args, **kwargs):
        self.logits_processors[0].start = None
        return super()._generate_batch(*args, **kwargs)


def test_rollout_logprobs_are_the_sampling_distribution_s_on_the_sampled_tokens():
    """Two-turn rollouts (a search, its documents, another search) sampled at temperature 0.7 and
    top-p 0.95 with the KV cache reused between turns: the logprobs handed to TRL line up with
    completion_ids and equal a fresh forward pass's log-softmax (same processing) on the same
    tokens; documents and the appended EOS have none."""
    tok = _tokenizer()
    model = tiny_model(tok, layers=2, hidden=32, heads=2, intermediate=64).eval()
    steer = _Steer(tok)
    gen = _SteeredGenerator(
        model, tok, batch_size=2, temperature=0.7, top_p=0.95, logits_processors=[steer], logprobs=True
    )
    torch.manual_seed(0)
    examples = [Q, {**Q, "id": "q2", "question": "Where is it ? and more words"}, Q]
    trajs = run_rollouts(examples, gen, BM25Retriever.build(DOCS), P, EnvConfig(top_k=1, max_turns=2), tok)
    assert [t.finish_reason for t in trajs] == ["max_turns"] * 3 and gen.store.reused_tokens > 0
    batch = rollout_batch(trajs, tok.eos_token_id, 512)
    warp = [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.95)]
    for t, ids, mask, lps in zip(trajs, batch["completion_ids"], batch["env_mask"], batch["logprobs"]):
        assert len(lps) == len(ids) == len(mask)
        assert [lp is not None for lp in lps] == [bool(m) for m in mask[:-1]] + [False]  # model tokens only
        with torch.no_grad():
            logits = model(torch.tensor([t.prompt_ids + ids])).logits[0, len(t.prompt_ids) - 1 : -1]
        for j, (tok_id, lp) in enumerate(zip(ids, lps)):
            if lp is None:
                continue
            if tok_id in (steer.open, steer.close):
                assert lp == 0.0  # forced: the only token left
                continue
            scores = steer.ban(logits[j : j + 1])
            for w in warp:
                scores = w(None, scores)
            assert lp == pytest.approx(scores.log_softmax(-1)[0, tok_id].item(), abs=1e-4)
        assert sum(lp is not None and lp < 0 for lp in lps) >= 4  # sampled words, not only forced tags


def test_logprobs_change_nothing_in_what_is_sampled():
    """The warpers HFGenerator passes itself (so the recorder sees the final distribution) draw
    the same tokens as transformers' own temperature and top-p, seed for seed."""
    tok = _tokenizer()
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64).eval()
    traj = new_trajectory(Q, P, tok)
    torch.manual_seed(3)
    out = HFGenerator(model, tok, temperature=0.7, top_p=0.9, logprobs=True, reuse_cache=False).generate(
        [traj], P.stop_strings(), 10
    )[0]
    torch.manual_seed(3)
    ref = model.generate(
        torch.tensor([traj.prompt_ids]),
        attention_mask=torch.ones(1, len(traj.prompt_ids), dtype=torch.long),
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        top_k=None,
        max_new_tokens=10,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    drawn = [t for t in ref[0, len(traj.prompt_ids) :].tolist() if t != tok.pad_token_id]  # as `_cut` keeps them
    assert out.ids == drawn[: len(out.ids)] and len(out.logprobs) == len(out.ids)
    greedy = HFGenerator(model, tok, logprobs=True).generate([traj], P.stop_strings(), 4)[0]
    assert greedy.logprobs is None  # only sampling records them


def test_logprobs_follow_the_eos_and_budget_rules_of_the_completion():
    """Aligned with `completion_with_eos`: a sampled EOS kept by the generator keeps its logprob;
    one a generator dropped (vLLM's adapter), the EOS appended after a stop, and a budget cut get
    None; a generator that records nothing gives all None (TRL: no correction), never a crash."""
    eos = 9
    model = Turn("model", "a b", [1, 2, eos], [-0.1, -0.2, -0.3])
    docs = Turn("env", "d", [5, 6])
    sampled = Trajectory("q", "?", "", [0], turns=[docs, model], eos_sampled=True, finish_reason="invalid")
    assert completion_logprobs(sampled, eos, len(completion_with_eos(sampled, eos, eos_rule="sampled")[0])) == [
        None,
        None,
        -0.1,
        -0.2,
        -0.3,
    ]
    cut = completion_logprobs(sampled, eos, len(completion_with_eos(sampled, eos, 4, eos_rule="sampled")[0]))
    assert cut == [None, None, -0.1, None]
    dropped = Trajectory("q", "?", "", [0], turns=[Turn("model", "a b", [1, 2], [-0.1, -0.2])], eos_sampled=True)
    assert completion_logprobs(dropped, eos, 3) == [-0.1, -0.2, None]
    stopped = Trajectory(
        "q", "?", "", [0], turns=[Turn("model", "a b", [1, 2], [-0.1, -0.2]), docs], finish_reason="max_turns"
    )
    assert rollout_batch([stopped], eos, 512)["logprobs"] == [[-0.1, -0.2, None, None, None]]
    unrecorded = Trajectory("q", "?", "", [0], turns=[Turn("model", "a", [1]), docs], finish_reason="max_turns")
    assert rollout_batch([unrecorded], eos, 512)["logprobs"] == [[None] * 4]


def test_trimmed_turns_keep_their_logprobs_aligned():
    """The env cuts a turn's ids (a qa reader's first line, IRCoT's EOS): the logprobs are cut alike."""
    from r3rag.core.env import _trimmed

    tok = _tokenizer()
    ids = tok.encode("Ava Smith <eos>", add_special_tokens=False)
    out = _trimmed(Generated("Ava Smith", ids, "eos", logprobs=[-1.0, -2.0, -3.0]), Protocol(name="ircot"), tok, "")
    assert out.ids == ids[:2] and out.logprobs == [-1.0, -2.0]


# ---- 5. resume ---------------------------------------------------------------------------------


class _Killed(Exception):
    pass


@pytest.fixture(scope="module")
def searching_policy(tmp_path_factory):
    """A runs dir whose SFT policy searches often enough (2 layers, 10 epochs: ~15 s) that GRPO
    groups differ in reward, so the loss is not 0 and the weights move."""
    from r3rag.experiments.pipeline import run_stage
    from tests.conftest import build_teacher_data

    runs = tmp_path_factory.mktemp("resume") / "runs"
    build_teacher_data(runs)
    run_stage(
        "sft",
        None,
        ["layers=2", "hidden=64", "heads=2", "intermediate=128", "epochs=10", "batch_size=16", "lr=1e-2", "bf16=false"],
        runs,
    )
    return runs


def _run_rl(runs, name: str, *extra: str):
    from r3rag.experiments.pipeline import run_stage

    return run_stage(
        "rl",
        None,
        [
            f"name={name}",
            "steps=4",
            "save_steps=3",
            "limit=8",
            "prompts_per_step=4",
            "num_generations=2",
            "bf16=false",
            "max_turns=3",
            "max_new_tokens=16",
            "lr=1e-3",
            "lr_scheduler=linear",
            "threads=1",
            "rewards={r3rag: 1.0, em: 0.0}",
            *extra,
        ],
        runs,
    )


def _kill_after_checkpoint(monkeypatch, step: int):
    """Stop the run the moment checkpoint-`step` is saved, as a kill would (no final model, no
    artifact), but at the same place every time."""
    from transformers import TrainerCallback

    from r3rag.rl import grpo

    class Kill(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise _Killed

    build = grpo.build_trainer
    monkeypatch.setattr(
        grpo, "build_trainer", lambda *a, callbacks=(), **kw: build(*a, callbacks=[*callbacks, Kill()], **kw)
    )


@pytest.mark.slow  # a straight and a killed-and-resumed GRPO run, with and without LoRA: ~11 s (2 AVX2 cores)
@pytest.mark.parametrize("lora", [False, True])
def test_a_resumed_run_ends_where_a_straight_run_ends(searching_policy, monkeypatch, lora):
    """4 steps straight, against 3 steps, a stop right after checkpoint-3, then `--resume`: the
    same per-step rewards and losses and the same final weights. 8 questions, 4 per step: the
    resume lands in the second epoch, whose order the sampler must draw as the straight run did;
    lr decays linearly (the scheduler's state), Adam's moments carry over (the optimizer's) and
    the rollouts sample on from the checkpoint's RNG state."""
    from safetensors.torch import load_file

    from r3rag.util.jsonl import read_jsonl

    runs, extra = searching_policy, [f"lora={str(lora).lower()}"]
    straight = _run_rl(runs, "straight", *extra)
    with monkeypatch.context() as m:
        _kill_after_checkpoint(m, 3)
        with pytest.raises(_Killed):
            _run_rl(runs, "resumed", *extra)
    resumed = _run_rl(runs, "resumed", *extra, "resume=true")
    assert resumed.manifest["metrics"]["resumed_from_step"] == 3
    a_rows, b_rows = (read_jsonl(ref.path / "metrics.jsonl") for ref in (straight, resumed))
    assert [r["step"] for r in a_rows] == [r["step"] for r in b_rows] == [1, 2, 3, 4]
    assert all(r["loss"] != 0 for r in a_rows)  # groups differ in reward: every step learns
    for k in (
        "reward",
        "loss",
        "learning_rate",
        "grad_norm",
        "entropy",
        "num_tokens",
        "rewards/r3rag/mean",
        "completions/mean_length",
        "rollout/searches",
    ):
        assert [r[k] for r in b_rows] == pytest.approx([r[k] for r in a_rows], rel=1e-5, abs=1e-7), k
    a, b = (load_file(ref.path / "model" / "model.safetensors") for ref in (straight, resumed))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
