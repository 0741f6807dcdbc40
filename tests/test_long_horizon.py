"""Long horizons (issue 48): questions that need up to 40 searches, folded contexts, a context
budget that is never passed, and a 40-turn trajectory through the loop, its scores and an RL step."""

import collections

import pytest
import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.core.metrics import exact_match
from r3rag.core.protocol import Protocol
from r3rag.data.world import WorldConfig, generate_world, world_vocabulary
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.synthesis.teachers import oracle_generator, verify, verify_evidence

P = Protocol(template="minimal", doc_style="plain")
SIZE = {"seed": 3, "n_clusters": 15, "test_clusters": 5, "dev_clusters": 5}  # 40 companies in every split
LONG = WorldConfig(**SIZE, long_horizon=[1, 40], long_per_count=1)


@pytest.fixture(scope="module")
def world():
    return generate_world(LONG)


@pytest.fixture(scope="module")
def retriever(world):
    return BM25Retriever.build(world.docs)


def _long(questions, n=None, qtype=None):
    return [
        q
        for q in questions
        if q["id"].startswith("L")
        and (n is None or q["metadata"]["hops"] == n)
        and (qtype is None or q["metadata"]["type"] == qtype)
    ]


# ---- the world ---------------------------------------------------------------------------------


def test_long_horizon_is_opt_in_and_leaves_the_world_as_it_was(world):
    base = generate_world(WorldConfig(**SIZE))
    assert world.docs[: len(base.docs)] == base.docs  # every document as it was, the mentors' after them
    for split, qs in base.splits.items():
        assert [q for q in world.splits[split] if not q["id"].startswith("L")] == qs
    assert world_vocabulary(base.config) == world_vocabulary()  # a basic world's tokenizer stays


def test_every_search_count_and_type_is_there_with_right_answers(world):
    docs = {d["id"]: d["text"] for d in world.docs}
    vocab = set(world_vocabulary(world.config))
    test = _long(world.test)
    counts = collections.Counter((q["metadata"]["type"], q["metadata"]["hops"]) for q in test)
    assert counts == {(t, n): 1 for t in ("mentor_chain", "founded_first", "count_before") for n in range(1, 41)}
    for q in test:
        meta = q["metadata"]
        assert len(set(meta["supporting_docs"])) == meta["hops"]  # n distinct documents: n searches
        for hop in meta["chain"]:
            assert docs[hop["doc_id"]] == hop["fact"]  # each hop's fact is its document, word for word
        assert set(q["question"].split()) <= vocab
        years = [int(h["value"]) for h in meta["chain"]] if meta["type"] != "mentor_chain" else None
        if meta["type"] == "founded_first":
            earliest = [h["fact"].split(" was founded")[0] for h, y in zip(meta["chain"], years) if y == min(years)]
            assert q["golden_answers"] == earliest
        if meta["type"] == "count_before":
            assert 0 <= int(q["golden_answers"][0]) < meta["hops"]
        if meta["type"] == "mentor_chain":
            for a, b in zip(meta["chain"], meta["chain"][1:]):
                assert b["fact"].startswith(a["value"] + " ")  # each hop reads the one before
    assert {q["id"] for q in _long(world.train)}.isdisjoint({q["id"] for q in test})


def test_bad_long_horizon_settings_are_one_line():
    for bad, needle in (
        ({"long_horizon": [0, 5]}, "1 <= lo <= hi <= 40"),
        ({"long_horizon": [5]}, "1 <= lo <= hi"),
        ({"long_horizon": [2, 30], "people_per_cluster": 20}, "needs people_per_cluster >= 30"),
        ({"long_horizon": [2, 30], "test_clusters": 2}, "the smallest has 16"),
        ({"long_horizon": [2, 3], "doc_unit": "entity", "doc_style": "prose"}, "needs doc_unit='fact'"),
    ):
        with pytest.raises(ValueError, match=needle):
            generate_world(WorldConfig(**bad))


def test_types_reads_only_those_questions_before_the_limit_and_stays_out_of_the_hash(world, tmp_path):
    from types import SimpleNamespace

    from r3rag.stages.common import QuestionSource
    from r3rag.stages.eval import Config as EvalConfig
    from r3rag.stages.rl import Config as RLConfig
    from r3rag.stages.rl import _dev_questions
    from r3rag.util.config import hashed_settings
    from r3rag.util.errors import UserError
    from r3rag.util.jsonl import write_jsonl

    write_jsonl(tmp_path / "test.jsonl", world.splits["test"])
    write_jsonl(tmp_path / "questions.jsonl", world.splits["test"])
    from_world = {"world": SimpleNamespace(path=tmp_path)}
    from_file = {"questions": SimpleNamespace(path=tmp_path / "questions.jsonl")}
    chains = [q["id"] for q in _long(world.splits["test"], qtype="mentor_chain")]
    for inputs in (from_world, from_file):
        picked = QuestionSource(split="test", types=["mentor_chain"], limit=5).read_questions(inputs)
        assert [q["id"] for q in picked] == chains[:5]  # the type first, then the first 5 of them
        every = QuestionSource(split="test", limit=5).read_questions(inputs)
        assert [q["id"] for q in every] == [q["id"] for q in world.splits["test"][:5]]  # as before: no L's
        with pytest.raises(UserError, match=r"types=\['chain'\]: no such question in .*its types: .*mentor_chain"):
            QuestionSource(split="test", types=["chain"]).read_questions(inputs)
    write_jsonl(tmp_path / "dev.jsonl", world.splits["dev"])  # rl's dev evaluation reads the same types
    dev = _dev_questions(RLConfig(eval_every=5, eval_limit=3, types=["count_before"]), from_world)
    assert [q["id"] for q in dev] == [q["id"] for q in _long(world.splits["dev"], qtype="count_before")][:3]
    assert "types" not in hashed_settings(EvalConfig())  # unset, every artifact keeps its id
    assert hashed_settings(EvalConfig(types=["mentor_chain"]))["types"] == ["mentor_chain"]


def test_the_oracle_teacher_solves_long_questions(world, retriever):
    questions = [q for n in (1, 7, 16, 33) for q in _long(world.test, n)]
    cfg = EnvConfig(top_k=3, max_turns=41, max_new_tokens=64, max_completion_tokens=100_000)
    trajs = run_rollouts(questions, oracle_generator(questions, P), retriever, P, cfg)
    for t, q in zip(trajs, questions):
        assert verify(t, q, P) == (True, "ok"), (q["metadata"]["type"], q["metadata"]["hops"])
        assert verify_evidence(t, q) == (True, "ok"), (q["metadata"]["type"], q["metadata"]["hops"])
        assert len(t.retrieved) == q["metadata"]["hops"]


# ---- folded contexts and the budget -----------------------------------------------------------


_TOKENIZERS: dict = {}


def _tokenizer(world):
    """The world's word-level tokenizer, trained once per module."""
    from r3rag.training.modeling import train_word_tokenizer

    if id(world) not in _TOKENIZERS:
        texts = [" ".join(world_vocabulary(world.config)), "<think> </think> <search> </search>"]
        _TOKENIZERS[id(world)] = train_word_tokenizer(texts)
    return _TOKENIZERS[id(world)]


class Recording:
    """The oracle, keeping every context it was asked to continue (text and ids) per trajectory."""

    def __init__(self, inner):
        self.inner, self.seen = inner, collections.defaultdict(list)

    def generate(self, contexts, stop, max_new_tokens):
        for c in contexts:
            self.seen[c.id].append((c.context_text(), c.context_ids()))
        return self.inner.generate(contexts, stop, max_new_tokens)


def _run(world, retriever, questions, **env):
    tok = _tokenizer(world)
    gen = Recording(oracle_generator(questions, P, tok))
    cfg = EnvConfig(top_k=3, max_turns=41, max_new_tokens=64, max_completion_tokens=100_000, **env)
    return run_rollouts(questions, gen, retriever, P, cfg, tok), gen.seen


def test_a_folded_context_shows_each_search_in_full_exactly_once(world, retriever):
    questions = _long(world.test, 12)
    trajs, seen = _run(world, retriever, questions, context="fold")
    for t in trajs:
        assert t.finish_reason == "answer" and exact_match(
            t.answer, [q for q in questions if q["id"] == t.id][0]["golden_answers"]
        )
        contexts = [text for text, _ in seen[t.id]]
        doc_turns = [turn for turn in t.turns if turn.stub_text is not None]
        assert len(doc_turns) == 12
        for k, turn in enumerate(doc_turns):
            shown = [i for i, c in enumerate(contexts) if turn.text in c]
            assert shown == [k + 1], k  # in full in the context right after its search, and never again
            assert all(contexts[i].count(turn.text) == 1 for i in shown)
        last = contexts[-1]
        assert sum(turn.stub_text in last for turn in doc_turns[:-1]) == 11  # the others as stubs
        for hop in [q for q in questions if q["id"] == t.id][0]["metadata"]["chain"][:-1]:
            assert hop["fact"] in last  # what it read lives on in its own notes


def test_the_context_budget_is_never_passed_and_folding_stays_within_it(world, retriever):
    questions = _long(world.test, 20)
    budget = 700
    kept, kept_seen = _run(world, retriever, questions, max_context_tokens=budget)
    folded, fold_seen = _run(world, retriever, questions, context="fold", max_context_tokens=budget)
    for seen in (kept_seen, fold_seen):
        assert max(len(ids) + 64 for calls in seen.values() for _, ids in calls) <= budget
    assert {t.finish_reason for t in kept} == {"context"}  # every document kept: the context outgrows it
    assert all(t.finish_reason == "answer" for t in folded)  # folded, 20 searches fit
    widest = {k: max(len(ids) for _, ids in calls) for k, calls in fold_seen.items()}
    assert max(widest.values()) < budget - 64


def test_bad_context_settings_are_one_line():
    from r3rag.stages.eval import Config, validate
    from r3rag.util.config import build_config
    from r3rag.util.errors import UserError

    with pytest.raises(UserError, match="allowed: keep_all, fold"):
        build_config(Config, {"context": "summarise"})
    with pytest.raises(UserError, match="eval.max_context_tokens: 32 leaves no room"):
        validate(Config(max_context_tokens=32, max_new_tokens=48))
    from r3rag.stages.rl import Config as RLConfig
    from r3rag.stages.rl import validate as rl_validate

    with pytest.raises(UserError, match="rl.context=fold: each model turn is a row of its own"):
        rl_validate(RLConfig(context="fold", algorithm="ppo", ppo_unit="step"))
    from r3rag.stages.synthesize import Config as SynthConfig
    from r3rag.stages.synthesize import _check

    with pytest.raises(UserError, match="the oracle teacher has no tokenizer"):  # never a budget left uncounted
        _check(SynthConfig(max_context_tokens=1024))


def test_the_prefix_cache_reuses_what_a_folded_context_kept(world, retriever):
    """transformers' rollouts of a folded context: the cache keeps the tokens before the fold, and
    greedy decoding gives the same tokens as encoding every context afresh."""
    from r3rag.generation.hf import HFGenerator
    from r3rag.training.modeling import tiny_model

    tok = _tokenizer(world)
    torch.manual_seed(0)
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64).eval()
    questions = _long(world.test, 3)[:2] + _long(world.test, 4)[:1]
    cfg = EnvConfig(top_k=2, max_turns=4, max_new_tokens=6, context="fold")
    cached = HFGenerator(model, tok, reuse_cache=True)
    fresh = HFGenerator(model, tok, reuse_cache=False)

    class Searching:  # the model's tokens, then a search of its question, so there are documents to fold
        def __init__(self, inner):
            self.inner = inner

        def generate(self, contexts, stop, n):
            outs = self.inner.generate(contexts, stop, n)
            for o in outs:
                o.text, o.ids, o.finish = (
                    " <search> founded </search>",
                    tok.encode(" <search> founded </search>", add_special_tokens=False),
                    "stop",
                )
            return outs

    a = run_rollouts(questions, Searching(cached), retriever, P, cfg, tok)
    b = run_rollouts(questions, Searching(fresh), retriever, P, cfg, tok)
    assert [t.context_ids() for t in a] == [t.context_ids() for t in b]
    assert cached.store.reused_tokens > 0


def _scripted_step(trainer, batch: dict, scores) -> dict:
    """One training step on these rollouts (`batch`, as rollout_batch built it, and their scores)
    instead of the trainer's own: the one mini-batch its loss weighed."""
    from r3rag.training.trainers import ROW_FIELDS

    def rollout(prompts, tr):
        out = {**batch, "scores": scores, "timing": {}}
        trainer.row_extras = {k: out.pop(k) for k in ROW_FIELDS if k in out}
        return out

    trainer.rollout_func = rollout
    seen = []
    compute = trainer._compute_loss
    trainer._compute_loss = lambda m, inputs: seen.append(inputs) or compute(m, inputs)
    trainer.train()
    (inputs,) = seen
    return inputs


def _one_step(**settings):
    """rl's settings for one optimizer step on one question's group of two (a scripted batch)."""
    from r3rag.stages.rl import Config

    return Config(steps=1, prompts_per_step=1, num_generations=2, bf16=False, save_steps=0, **settings)


# ---- 40 turns end to end ----------------------------------------------------------------------


def test_a_40_turn_trajectory_runs_through_the_loop_its_scores_and_an_rl_step(world, retriever, tmp_path):
    from r3rag.rl.grpo import build_trainer, rollout_batch
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.training.modeling import tiny_model

    q = _long(world.test, 39, "mentor_chain")[0]
    tok = _tokenizer(world)
    for context in ("keep_all", "fold"):
        cfg = EnvConfig(top_k=2, max_turns=40, max_new_tokens=64, max_completion_tokens=100_000, context=context)
        (traj,) = run_rollouts([q], oracle_generator([q], P, tok), retriever, P, cfg, tok)
        assert traj.model_turn_count() == 40 and len(traj.retrieved) == 39 and traj.finish_reason == "answer"
        scores = RewardScorer({"em": 1.0}, RewardSettings(relevance="gold"), P).score([traj, traj], [q, q])
        assert scores[0]["em"] == 1.0 and scores[0]["format"] == 1.0
    batch = rollout_batch([traj, traj], tok.eos_token_id, 100_000)
    assert sum(batch["env_mask"][0]) > 39 * 5 and 0 in batch["env_mask"][0]
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64, max_positions=8192)
    rl = _one_step(lr=1e-3, max_completion_tokens=100_000, algorithm="ppo")
    scorer = RewardScorer({"em": 1.0}, RewardSettings(), P)
    trainer = build_trainer(model, tok, [q], None, P, scorer, rl, tmp_path)
    wrong = run_rollouts([q], oracle_generator([{**q, "golden_answers": ["nowhere"]}], P, tok), retriever, P, cfg, tok)[
        0
    ]
    pair = [traj, wrong]
    fixed = rollout_batch(pair, tok.eos_token_id, 100_000)
    trainer.rollout_func = lambda prompts, tr: {**fixed, "scores": scorer.score(pair, [q, q]), "timing": {}}
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ---- training rows of a folded trajectory -----------------------------------------------------


def test_sft_rows_of_a_folded_trajectory_are_the_contexts_it_saw_and_its_own_tokens(world, retriever):
    """sft.view=step with context=fold: one row per model turn, its prompt exactly the context the
    loop showed that turn (earlier searches as stubs), its labels exactly that turn's tokens."""
    from r3rag.stages.sft import Config, validate
    from r3rag.training.helpers import IGNORE, tokenize_steps
    from r3rag.util.errors import UserError

    questions = _long(world.test, 6)
    trajs, seen = _run(world, retriever, questions, context="fold")
    tok = _tokenizer(world)
    for t in trajs:
        rows = tokenize_steps(t.to_json(), tok, protocol=P, fold=True)
        model_turns = [turn for turn in t.turns if turn.role == "model"]
        assert len(rows) == len(model_turns) == len(seen[t.id])
        for (ids, labels), turn, (_, context) in zip(rows, model_turns, seen[t.id]):
            n = len(context)
            assert ids[:n] == context and all(x == IGNORE for x in labels[:n])
            assert ids[n : n + len(turn.ids)] == turn.ids == labels[n : n + len(turn.ids)]
        kept = tokenize_steps(t.to_json(), tok, protocol=P, fold=False)
        assert len(kept[-1][0]) > len(rows[-1][0])  # keep_all's last row holds every document
    with pytest.raises(UserError, match="set sft.view=step"):
        validate(Config(context="fold"))


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_rows_of_a_folded_trajectory_reproduce_its_turns_and_train(world, retriever, tmp_path, algorithm):
    """rl.context=fold: one row per model turn, its prompt the context the turn was sampled from,
    its completion the turn's tokens; GRPO gives every row its trajectory's advantage, PPO makes
    each row an episode rewarded with its trajectory's reward (its critic trains on the rows too)."""
    from r3rag.rl.fold_rows import turn_rows
    from r3rag.rl.grpo import build_trainer, rollout_batch
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.training.modeling import tiny_model

    q = _long(world.test, 4, "mentor_chain")[0]
    right, seen = _run(world, retriever, [q], context="fold")
    wrong_q = {**q, "golden_answers": ["nowhere"]}
    wrong, _ = _run(world, retriever, [wrong_q], context="fold")
    tok = _tokenizer(world)
    for k, row in enumerate(turn_rows(right[0], tok.eos_token_id)):
        turn = [t for t in right[0].turns if t.role == "model"][k]
        assert row["prompt_ids"] == seen[q["id"]][k][1]  # exactly the context the loop showed this turn
        assert row["completion_ids"][: len(turn.ids)] == turn.ids
    pair = [right[0], wrong[0]]
    batch = rollout_batch(pair, tok.eos_token_id, 100_000, fold=True)
    scorer = RewardScorer({"em": 1.0}, RewardSettings(), P)
    cfg = _one_step(lr=1e-2, context="fold", algorithm=algorithm)
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64, max_positions=4096)
    trainer = build_trainer(model, tok, [q], None, P, scorer, cfg, tmp_path)

    before = [p.detach().clone() for p in model.parameters()]
    inputs = _scripted_step(trainer, batch, scorer.score(pair, [q, q]))
    assert inputs["completion_ids"].shape[0] == 10  # 5 model turns each (4 searches and the answer)
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    per_row = (
        (inputs["advantages"] * mask).sum(1) / mask.sum(1) if inputs["advantages"].dim() == 2 else inputs["advantages"]
    )
    right_rows = inputs["row_of"] == 0  # the right answer's rows gain, the wrong one's lose
    assert (per_row[right_rows] > 0).all() and (per_row[~right_rows] < 0).all()
    if algorithm == "grpo":
        assert len(set(round(a, 6) for a in per_row.tolist())) == 2  # one advantage per trajectory
    else:
        assert "values" in inputs and trainer.critic_optimizer.state_dict()["state"]  # the critic trained
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
