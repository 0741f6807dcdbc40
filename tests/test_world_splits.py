"""The world's dev split and named questions (r3rag.data.world, r3rag.data.world_questions):
splits disjoint by entity and stable under a seed, chain questions unchanged by either feature,
and named questions answerable from one BM25 retrieval of their text."""

import hashlib
import json

import pytest

from r3rag.data.world import WorldConfig, chain_names, generate_world, world_vocabulary

HARD = dict(paraphrases=3, question_types="all")
SPLIT = WorldConfig(seed=5, n_clusters=12, test_clusters=2, dev_clusters=2, named=0.5, **HARD)


def _sha(rows) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def _chain(questions: list[dict]) -> list[dict]:
    return [q for q in questions if q["metadata"]["type"] != "named"]


@pytest.fixture(scope="module")
def world():
    return generate_world(SPLIT)


@pytest.mark.parametrize(
    "config, train_sha, test_sha",
    [
        (
            WorldConfig(seed=0),
            "e5edd07ac2d63b340b850a3e470423f1e6aa9513f9b2664ae162b48c50cc3fca",
            "a14b603ec6ddedf0eb05dcd652cb8b1e0fffa9d7ca3266741ede111efc58a0b0",
        ),
        (
            WorldConfig(seed=1, **HARD),
            "91f48d9ea2170dd50b099e8c57948b8b006098a569778d563d0f0c116741f62d",
            "4c65fffa7185d86e46be7a8c980df3a58382c6d7d739f491ca2300526db99afb",
        ),
    ],
)
def test_worlds_without_the_new_settings_are_what_they_were(config, train_sha, test_sha):
    """Recorded from the generator before dev splits and named questions existed (demo seed 0,
    the replication's seed 1): every question, id and order the same."""
    w = generate_world(config)
    assert (_sha(w.train), _sha(w.test), w.dev) == (train_sha, test_sha, [])


def test_dev_comes_out_of_train_and_leaves_chain_questions_as_they_were(world):
    plain = generate_world(WorldConfig(**{**SPLIT.__dict__, "dev_clusters": 0, "named": 0.0}))
    first_dev = SPLIT.n_clusters - SPLIT.test_clusters - SPLIT.dev_clusters
    assert _chain(world.test) == plain.test
    assert _chain(world.train) == [q for q in plain.train if q["metadata"]["cluster"] < first_dev]
    moved = [q for q in plain.train if q["metadata"]["cluster"] >= first_dev]
    assert [(q["id"], q["question"]) for q in _chain(world.dev)] == [(q["id"], q["question"]) for q in moved]
    assert len(moved) > 100


def test_splits_are_disjoint_by_question_and_entity(world):
    ids = {name: {q["id"] for q in qs} for name, qs in world.splits.items()}
    assert all(ids.values()) and sum(map(len, ids.values())) == len(set().union(*ids.values()))
    for name, qs in world.splits.items():
        assert {q["metadata"]["split"] for q in qs} == {name}
    names = {name: chain_names(qs) for name, qs in world.splits.items()}
    assert not names["dev"] & names["test"] and not names["dev"] & names["train"] and not names["test"] & names["train"]
    blob = " | ".join(q["question"] for q in world.train)  # no training question names a dev or test entity
    assert not any(f" {n} " in f" {blob} " for n in names["dev"] | names["test"])


def test_splits_are_stable_under_a_seed_and_differ_across_seeds(world):
    again = generate_world(SPLIT)
    assert {s: _sha(qs) for s, qs in again.splits.items()} == {s: _sha(qs) for s, qs in world.splits.items()}
    other = generate_world(WorldConfig(**{**SPLIT.__dict__, "seed": 6}))
    assert _sha(other.dev) != _sha(world.dev)


def test_named_questions_name_every_intermediate_entity(world):
    by_id = {q["id"]: q for qs in world.splits.values() for q in qs}
    vocab = set(world_vocabulary(SPLIT))
    named = [q for q in by_id.values() if q["metadata"]["type"] == "named"]
    chain = _chain(list(by_id.values()))
    assert 0.4 * len(chain) < len(named) < 0.6 * len(chain)  # named=0.5 of the chain questions
    for q in named:
        meta, twin = q["metadata"], by_id["q" + q["id"][1:]]
        assert meta["path"] == twin["metadata"]["type"] and meta["split"] == twin["metadata"]["split"]
        assert meta["chain"] == twin["metadata"]["chain"] and q["golden_answers"] == twin["golden_answers"]
        assert q["question"].startswith(twin["question"].removesuffix(" ?") + " , where the ")
        assert all(f" {hop['value']} " in q["question"] for hop in meta["chain"][:-1])
        assert meta["hops"] == 1 and meta["stated"] == len(meta["chain"]) - 1
        assert meta["supporting_docs"] == [meta["chain"][-1]["doc_id"]]
        assert set(q["question"].split()) <= vocab


def test_named_questions_keep_the_chain_questions_in_order(world):
    plain = generate_world(WorldConfig(**{**SPLIT.__dict__, "named": 0.0}))
    for name in ("train", "dev", "test"):
        assert _chain(world.splits[name]) == plain.splits[name]
        kinds = [q["metadata"]["type"] == "named" for q in world.splits[name][:60]]
        assert any(kinds) and not all(kinds)  # twins are spread through a split, not appended


def test_named_questions_answer_from_one_retrieval_chain_questions_do_not(world):
    """BM25 on the world corpus with the question text alone: the answering document of a named
    question is in the top 12 (the large-k RAG reader's depth) for nearly all, in the top 5 for
    most; a chain question's documents almost never are."""
    from r3rag.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever.build(world.docs)

    def found(qs, k):
        hits = retriever.search([q["question"] for q in qs], k)
        return sum(set(q["metadata"]["supporting_docs"]) <= {h.doc_id for h in hs} for q, hs in zip(qs, hits)) / len(qs)

    named = [q for q in world.test if q["metadata"]["type"] == "named"]
    assert len(named) > 100
    assert found(named, 12) >= 0.95 and found(named, 5) >= 0.7
    assert found(_chain(world.test), 12) <= 0.05


def test_the_oracle_answers_a_named_question_with_one_search(world):
    from r3rag.core.env import EnvConfig, run_rollouts
    from r3rag.core.protocol import Protocol
    from r3rag.retrieval.bm25 import BM25Retriever
    from r3rag.synthesis.teachers import oracle_generator, verify, verify_evidence

    protocol = Protocol(template="minimal", doc_style="plain")
    named = [q for q in world.test if q["metadata"]["type"] == "named"][:60]
    trajs = run_rollouts(
        named, oracle_generator(named, protocol), BM25Retriever.build(world.docs), protocol, EnvConfig(top_k=3)
    )
    assert all(len(t.retrieved) == 1 for t in trajs)
    assert all(t.queries[0] == q["metadata"]["chain"][-1]["query"] for t, q in zip(trajs, named))
    ok = [verify(t, q, protocol)[0] and verify_evidence(t, q)[0] for t, q in zip(trajs, named)]
    assert sum(ok) >= 0.95 * len(named)


def test_dev_and_named_settings_are_checked():
    with pytest.raises(ValueError, match="exceed n_clusters"):
        generate_world(WorldConfig(n_clusters=4, test_clusters=2, dev_clusters=3))
    with pytest.raises(ValueError, match="named"):
        generate_world(WorldConfig(named=1.5))


def test_world_stage_writes_dev_and_probes_named_questions_apart(tmp_path):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl
    from tests.conftest import TINY_WORLD

    small = {**TINY_WORLD, "n_clusters": 6, "dev_clusters": 1, "named": 0.3}
    ref = run_stage("world", None, [f"{k}={v}" for k, v in small.items()], tmp_path / "runs")
    m = ref.manifest["metrics"]
    dev = read_jsonl(ref.path / "dev.jsonl")
    assert m["dev_questions"] == len(dev) > 0 and {q["metadata"]["split"] for q in dev} == {"dev"}
    assert m["named_questions"]["test"] > 0 and "named_question_only_all_docs@3" in m
    assert m["question_only_all_docs@3"] <= 0.05  # chain questions only, as before
    plain = run_stage("world", None, [f"{k}={v}" for k, v in TINY_WORLD.items()], tmp_path / "runs")
    assert not (plain.path / "dev.jsonl").exists()  # no dev split, no file: eval on it fails loudly
