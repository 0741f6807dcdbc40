"""Reward components on hand-made trajectories, the R3-RAG fold, and the LLM judges over a loopback server."""

import pytest

from r3rag.core.env import Trajectory, Turn
from r3rag.core.protocol import Protocol
from r3rag.evaluation.judge import JudgeError, JudgeSpec
from r3rag.rl.relevance import EmbeddingRelevance, gold_relevance, parse_relevance
from r3rag.rl.rewards import (
    R3ragWeights,
    RewardScorer,
    RewardSettings,
    SearchR1Format,
    r3rag_reward,
    rollout_stats,
    search_r1_format_reward,
    trl_reward_funcs,
)
from r3rag.util.errors import UserError
from tests.chat_server import ChatServer, last_user_text

P = Protocol()
EX = {
    "id": "q1",
    "question": "Where is the company Ava Smith works for?",
    "golden_answers": ["Velmar"],
    "metadata": {"supporting_docs": ["p1", "c1"]},
}
DOC_P1 = {"id": "p1", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs .", "score": 2.0}
DOC_C1 = {"id": "c1", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar .", "score": 2.0}
DOC_X = {"id": "x9", "title": "Mira Oak", "text": "Mira Oak was born in Dunmore .", "score": 1.0}


def traj(model_texts, docs_per_search, answer=None, finish="answer"):
    """A finished trajectory: model turns, each search followed by its documents."""
    t = Trajectory(id="q1", question=EX["question"], prompt=P.prompt(EX["question"]))
    docs = iter(docs_per_search)
    for text in model_texts:
        step = P.parse_step(text)
        t.turns.append(Turn("model", text))
        t.steps.append({"kind": step.kind, "query": step.query, "answer": step.answer, "reason": step.reason})
        if step.kind == "search":
            found = next(docs, None)
            if found is not None:
                t.documents.append(found)
                t.retrieved.append([d["id"] for d in found])
                t.turns.append(Turn("env", "<information> ... </information>"))
    t.answer, t.finish_reason = answer, finish
    return t


GOOD = traj(
    [
        "<think> first Ava </think> <search> Ava Smith works </search>",
        "<search> Zentro Labs headquartered </search>",
        "<answer> Velmar </answer>",
    ],
    [[DOC_P1, DOC_X], [DOC_C1]],
    answer="Velmar",
)
WRONG = traj(["<search> Ava Smith works </search>", "<answer> Dunmore </answer>"], [[DOC_X]], answer="Dunmore")
REPEAT = traj(
    ["<search> Ava Smith </search>", "<search> Ava Smith </search>"], [[DOC_P1], [DOC_P1]], finish="max_turns"
)
BROKEN = traj(["<search> Ava Smith </search>", "<search> unclosed"], [[DOC_P1]], finish="invalid")


def scores(weights, settings=None, trajs=(GOOD, WRONG, REPEAT, BROKEN)):
    return RewardScorer(weights, settings or RewardSettings(relevance="gold"), P).score(list(trajs), [EX] * len(trajs))


def test_outcome_and_format_components_on_hand_made_trajectories():
    good, wrong, repeat, broken = scores({"em": 1.0})
    assert good == {"em": 1.0, "f1": 1.0, "cover": 1.0, "format": 1.0}
    assert wrong["em"] == 0.0 and wrong["format"] == 1.0
    assert repeat == {"em": 0.0, "f1": 0.0, "cover": 0.0, "format": 0.0}  # no answer at the end
    assert broken["format"] == 0.0
    partial = traj(["<answer> Velmar city </answer>"], [], answer="Velmar city")
    (p,) = scores({}, trajs=[partial])
    assert p["em"] == 0.0 and p["cover"] == 1.0 and p["f1"] == pytest.approx(2 / 3)
    unbalanced = traj(["<think> hmm <answer> Velmar </answer>"], [], answer="Velmar")
    (u,) = scores({}, trajs=[unbalanced])
    assert u["em"] == 1.0 and u["format"] == 0.0


def test_search_r1_graded_format_matches_the_v03_table():
    w = SearchR1Format(structure=0.2, final=0.1, retrieval=0.1)
    assert search_r1_format_reward(GOOD, EX, valid=True, w=w) == 1.0
    assert search_r1_format_reward(GOOD, EX, valid=False, w=w) == pytest.approx(0.8)
    assert search_r1_format_reward(WRONG, EX, valid=True, w=w) == pytest.approx(0.2)  # no gold in its docs
    wrong_but_found = traj(
        ["<search> Zentro Labs </search>", "<answer> Dunmore </answer>"], [[DOC_C1]], answer="Dunmore"
    )
    assert search_r1_format_reward(wrong_but_found, EX, valid=True, w=w) == pytest.approx(0.3)
    assert search_r1_format_reward(WRONG, EX, valid=False, w=w) == pytest.approx(0.1)
    assert search_r1_format_reward(BROKEN, EX, valid=False, w=w) == 0.0
    assert [s["search_r1_format"] for s in scores({"search_r1_format": 1.0})] == pytest.approx([1.0, 0.2, 0.0, 0.0])


def test_gold_relevance_counts_new_gold_documents_per_step():
    assert gold_relevance(GOOD, EX) == [1.0, 1.0]
    assert gold_relevance(WRONG, EX) == [0.0]
    assert gold_relevance(REPEAT, EX) == [1.0, 0.0]  # the same document again earns nothing
    by_title = {**EX, "metadata": {"supporting_titles": ["zentro labs"]}}
    assert gold_relevance(GOOD, by_title) == [0.0, 1.0]
    with pytest.raises(UserError, match="supporting_docs"):
        gold_relevance(GOOD, {**EX, "metadata": {}})


def test_r3rag_fold_follows_the_formula():
    w = R3ragWeights()
    assert r3rag_reward(GOOD, [1.0, 0.5], True, w) == pytest.approx(2.0 + (1.6 + 0.8) / 2)
    assert r3rag_reward(WRONG, [0.5], False, w) == pytest.approx(0.8 * 0.5)
    assert r3rag_reward(REPEAT, [1.0, 0.0], False, w) == pytest.approx(0.9 * 1.0 / 2)
    assert r3rag_reward(BROKEN, [1.0], False, w) == pytest.approx((1.0 - 0.9) / 2)  # unscaled, then -0.9
    no_search = traj(["<answer> Velmar </answer>"], [], answer="Velmar")
    assert r3rag_reward(no_search, [], True, w) == 2.0
    first_turn_broken = traj(["<search> oops"], [], finish="invalid")
    assert r3rag_reward(first_turn_broken, [], False, w) == pytest.approx(-0.9)
    rows = scores({"r3rag": 1.0, "relevance": 0.0})
    assert [r["r3rag"] for r in rows] == pytest.approx([2.0 + 1.6, 0.0, 0.9 * 0.5, (1.0 - 0.9) / 2])
    assert [r["relevance"] for r in rows] == pytest.approx([1.0, 0.0, 0.5, 1.0])


def test_embedding_relevance_prefers_the_document_about_the_question():
    rel = EmbeddingRelevance("", doc_chars=512)  # the packaged all-MiniLM-L6-v2, offline
    step = traj(["<search> Ava Smith </search>", "<search> Mira </search>"], [[DOC_P1], [DOC_X]], finish="max_turns")
    (scores_,) = rel([step], [EX])
    assert len(scores_) == 2 and all(0.0 <= s <= 1.0 for s in scores_)
    assert scores_[0] > scores_[1]


def test_unknown_component_and_bad_settings_are_user_errors():
    with pytest.raises(UserError, match="unknown reward 'emm'"):
        RewardScorer({"emm": 1.0}, RewardSettings(relevance="gold"), P)
    with pytest.raises(UserError, match="relevance"):
        RewardScorer({"r3rag": 1.0}, RewardSettings(relevance="bm25"), P)
    with pytest.raises(UserError, match="set endpoint and model"):
        RewardScorer({"judge": 1.0}, RewardSettings(relevance="gold"), P).score([WRONG], [EX])


def test_trl_reward_funcs_log_every_component_and_weight_the_named_ones():
    scorer = RewardScorer({"em": 1.0, "search_r1_format": 0.5}, RewardSettings(relevance="gold"), P)
    funcs, weights = trl_reward_funcs(scorer)
    assert [f.__name__ for f in funcs] == ["em", "f1", "cover", "format", "search_r1_format"]
    assert weights == [1.0, 0.0, 0.0, 0.0, 0.5]
    logged = {}
    rows = scorer.score([GOOD, WRONG], [EX, EX])
    out = funcs[0](
        prompts=["p", "p"],
        completions=["c", "c"],
        scores=rows,
        finish_reason=["answer", "max_turns"],
        num_searches=[2, 1],
        log_metric=logged.__setitem__,
    )
    assert out == [1.0, 0.0]
    assert logged["rollout/searches"] == 1.5 and logged["rollout/finish_answer"] == 0.5
    assert rollout_stats({"finish_reason": ["invalid"], "num_searches": [0]})["rollout/finish_invalid"] == 1.0


def judge_reply(body):
    """A scripted judge: relevance by whether the documents name Velmar or Zentro, correctness by 'Velmar'."""
    text = last_user_text(body)
    if "Relevance:" in text:
        return "The documents help. Relevance: 0.90" if "Zentro" in text else "Unrelated.\nRelevance: 0.1"
    return "Final answer: True" if "Predicted answer: velmar" in text.lower() else "Final answer: False"


def test_llm_judge_scores_relevance_and_outcome_over_http():
    with ChatServer(reply=judge_reply) as srv:
        settings = RewardSettings(relevance="judge", judge=JudgeSpec(endpoint=srv.url, model="judge-model"))
        city = traj(
            ["<search> Ava Smith </search>", "<answer> velmar city </answer>"], [[DOC_P1]], answer="velmar city"
        )
        rows = scores(
            {"r3rag": 1.0, "judge": 0.0, "relevance": 0.0},
            RewardSettings(relevance="judge", judge=settings.judge, r3rag=R3ragWeights(correct="judge")),
            trajs=[GOOD, WRONG, city],
        )
        bodies = [last_user_text(b) for b in srv.bodies()]
    assert [r["relevance"] for r in rows] == pytest.approx([(0.9 + 0.9) / 2, 0.1, 0.9])
    assert [r["judge"] for r in rows] == [1.0, 0.0, 0.0]  # GOOD string-matches; "velmar city" is judged
    assert [r["r3rag"] for r in rows] == pytest.approx([2.0 + 1.6 * 0.9, 0.8 * 0.1, 0.8 * 0.9])
    relevance_prompts = [b for b in bodies if "Relevance:" in b]
    assert len(relevance_prompts) == 4 and all(EX["question"] in b for b in relevance_prompts)
    assert any("<search> Zentro Labs headquartered </search>" in b for b in relevance_prompts)
    assert sum("Predicted answer" in b for b in bodies) == 2  # not for the exact match


def test_judge_down_after_retries_stops_with_a_clear_error():
    with ChatServer(reply=judge_reply, faults=lambda body: "500") as srv:
        spec = JudgeSpec(endpoint=srv.url, model="judge-model")
        scorer = RewardScorer({"r3rag": 1.0}, RewardSettings(relevance="judge", judge=spec), P)
        scorer.client().backoff = 0.01
        with pytest.raises(JudgeError, match="relevance judge endpoint .*http_500"):
            scorer.score([GOOD], [EX])
    with ChatServer(reply=lambda body: "I cannot say.") as srv:
        spec = JudgeSpec(endpoint=srv.url, model="judge-model")
        with pytest.raises(JudgeError, match="no 'Relevance: x.xx'"):
            RewardScorer({"relevance": 1.0}, RewardSettings(relevance="judge", judge=spec), P).score([GOOD], [EX])
    assert parse_relevance("so Relevance: 1.4") == 1.0 and parse_relevance("Relevance: .25") == 0.25


def test_the_default_relevance_reads_no_gold_documents():
    """Embedding relevance is the default: a process reward that works on any corpus; gold is an oracle."""
    assert RewardSettings().relevance == "embedding"
