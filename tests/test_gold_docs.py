"""One gold-document rule (r3rag.core.gold_docs) for its four callers: the gold relevance reward, eval's
gold-document recall, the gold reader's retriever and the oracle teacher. Each case below is one
where they used to disagree (titles compared four ways; ids and titles mixed by one caller only)."""

import pytest

from r3rag.core.env import EnvConfig, Trajectory, run_rollouts
from r3rag.core.gold_docs import gold_docs, require_gold_docs, title_key
from r3rag.core.protocol import Protocol
from r3rag.data.gold import GoldRetriever
from r3rag.evaluation.predictions import gold_recall, to_prediction
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.rl.relevance import gold_relevance
from r3rag.synthesis.teachers import gold_kind, oracle_generator, verify, verify_evidence
from r3rag.util.errors import UserError

CORPUS = [
    {"id": "d1", "title": "gare du nord", "text": "Gare du Nord is a railway station in Paris ."},
    {"id": "d2", "title": "Paris", "text": "Paris is the capital city of France ."},
    {"id": "d3", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar ."},
    {"id": "d4", "title": "Zentro Labs", "text": "Zentro Labs makes wooden toys ."},  # same title, another id
]
# The question file spells a title with another case and a double space: it used to be gold for
# the relevance reward and the gold reader, and missed by eval's recall and by the oracle.
BY_TITLE = {
    "id": "t1",
    "question": "In which city is the Gare du Nord railway station ?",
    "golden_answers": ["Paris"],
    "metadata": {"supporting_titles": ["Gare du  Nord", "Paris"]},
}
# Ids and titles both given: the relevance reward used to accept either, eval's recall ids only.
BY_ID = {
    "id": "i1",
    "question": "Where is Zentro Labs headquartered ?",
    "golden_answers": ["Velmar"],
    "metadata": {"supporting_docs": ["d3"], "supporting_titles": ["Zentro Labs"]},
}


def test_title_case_and_spacing_are_matched_alike_by_all_four_callers():
    protocol = Protocol(template="minimal", doc_style="plain")
    assert gold_kind(BY_TITLE) == "titles"
    (traj,) = run_rollouts(
        [BY_TITLE],
        oracle_generator([BY_TITLE], protocol),
        BM25Retriever.build(CORPUS),
        protocol,
        EnvConfig(top_k=1, max_turns=4),
    )
    # The oracle searched the question (finding d1), then only "Paris": it counted d1 as found.
    assert traj.queries == [BY_TITLE["question"], "Paris"]
    assert [[d["id"] for d in docs] for docs in traj.documents] == [["d1"], ["d2"]]
    assert verify(traj, BY_TITLE, protocol) == (True, "ok")
    assert verify_evidence(traj, BY_TITLE) == (True, "ok")
    assert gold_relevance(traj, BY_TITLE) == [1.0, 1.0]
    assert gold_recall(traj, BY_TITLE) == 1.0
    assert to_prediction("oracle", traj, BY_TITLE)["gold_doc_recall"] == 1.0
    (hits,) = GoldRetriever(CORPUS, [BY_TITLE]).search([BY_TITLE["question"]], k=1)
    assert sorted(h.doc_id for h in hits) == ["d1", "d2"]


def test_ids_win_over_titles_for_every_caller():
    other = Trajectory(id="i1", question=BY_ID["question"], prompt="", documents=[[CORPUS[3]]])  # d4: title only
    right = Trajectory(id="i1", question=BY_ID["question"], prompt="", documents=[[CORPUS[3]], [CORPUS[2]]])
    assert gold_relevance(other, BY_ID) == [0.0]
    assert gold_recall(other, BY_ID) == 0.0
    assert gold_relevance(right, BY_ID) == [0.0, 1.0]
    assert gold_recall(right, BY_ID) == 1.0
    (hits,) = GoldRetriever(CORPUS, [BY_ID]).search([BY_ID["question"]], k=1)
    assert [h.doc_id for h in hits] == ["d3"]
    assert gold_kind(BY_ID) is None  # named by id without a chain: nothing for the oracle to follow


def test_the_matcher_itself():
    gold = gold_docs(BY_TITLE)
    assert gold.by == "title" and gold.keys == {"gare du nord", "paris"}
    assert gold.key({"id": "x", "title": " GARE du nord "}) == "gare du nord"
    assert gold.key({"id": "x", "title": "The Gare du Nord"}) is None  # articles are not dropped
    assert gold.missing([CORPUS[1]]) == ["Gare du  Nord"]  # as the question spells it
    assert gold_docs({"id": "q", "metadata": {}}) is None and gold_docs({"id": "q"}) is None
    assert title_key("A  b\tC") == "a b c"
    with pytest.raises(UserError, match="question 'q' has no gold documents"):
        require_gold_docs({"id": "q", "metadata": {}}, "the gold reader")
    assert gold_recall(Trajectory(id="q", question="?", prompt=""), {"id": "q"}) is None
