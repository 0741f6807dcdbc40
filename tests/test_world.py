"""Tests for the procedurally generated world (r3rag.data.world)."""

import json
import re

import pytest

from r3rag.data.world import World, WorldConfig, generate_world, world_vocabulary

SMALL = dict(
    n_clusters=6,
    test_clusters=2,
    people_per_cluster=10,
    companies_per_cluster=4,
    universities_per_cluster=2,
    n_cities=20,
    n_countries=5,
    doc_unit="entity",
)


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(WorldConfig(seed=3, **SMALL))


def _dump(w: World) -> str:
    return json.dumps({"docs": w.docs, "train": w.train, "test": w.test}, sort_keys=True)


def _questions(w: World) -> list[dict]:
    return w.train + w.test


def _contains(text: str, name: str) -> bool:
    """Token-bounded containment, so 'Ava Smith' does not match 'Ava Smithson'."""
    return f" {name} " in f" {text} "


# -- parsing the documents back into facts (independent of the chains) -----

_PATTERNS = {
    "p": {"born": r"born in (\S+)", "works": r"works for (\S+ \S+)", "studied": r"studied at (\S+ \S+)"},
    "c": {
        "headquartered": r"headquartered in (\S+)",
        "founded": r"in (\d{4})",
        "founder": r"(?:founder (?:is )?|founded by )(\S+ \S+)",
    },
    "u": {"located": r"located in (\S+)"},
    "city": {"country": r"country (?:of )?(\S+) \.$"},
    "n": {},
}


def _split_query(query: str) -> tuple[str, str]:
    """ "Ava Smith works for" -> ("Ava Smith", "works for")."""
    from r3rag.data.world import RELATION_PHRASES

    for phrase in RELATION_PHRASES.values():
        if query.endswith(" " + phrase):
            return query[: -len(phrase) - 1], phrase
    raise AssertionError(f"query {query!r} does not end with a relation phrase")


def _kind(doc_id: str) -> str:
    return doc_id.rstrip("0123456789")


def _parse_facts(w: World) -> dict[str, dict[str, str]]:
    facts = {}
    for doc in w.docs:
        parsed = {}
        for relation, pattern in _PATTERNS[_kind(doc["id"])].items():
            match = re.search(pattern, doc["text"])
            assert match, (relation, doc)
            parsed[relation] = match.group(1)
        facts[doc["title"]] = parsed
    return facts


PATHS = {
    "employer_city": ("works", "headquartered"),
    "employer_country": ("works", "headquartered", "country"),
    "school_city": ("studied", "located"),
    "founder_birthplace": ("founder", "born"),
    "founder_school": ("founder", "studied"),
    "employer_founded": ("works", "founded"),
    "employer_founder_birthplace": ("works", "founder", "born"),
}


# -- tests -----------------------------------------------------------------


def test_deterministic_for_seed(world):
    again = generate_world(WorldConfig(seed=3, **SMALL))
    assert _dump(again) == _dump(world)


def test_different_seeds_differ(world):
    other = generate_world(WorldConfig(seed=4, **SMALL))
    assert _dump(other) != _dump(world)
    assert [d["title"] for d in other.docs] != [d["title"] for d in world.docs]


def test_vocabulary_is_seed_independent_and_clean():
    vocab = world_vocabulary()
    assert vocab == world_vocabulary()
    assert len(vocab) == len(set(vocab))
    from r3rag.data import world as w

    pools = [w.FIRST_NAMES, w.LAST_NAMES, w.CITY_NAMES, w.COUNTRY_NAMES, w.COMPANY_WORDS, w.UNIVERSITY_WORDS]
    assert [len(p) for p in pools] == [300, 300, 300, 60, 300, 100]
    pool_words = [word for pool in pools for word in pool]
    assert len({x.lower() for x in pool_words}) == len(pool_words)
    template_words = {x.lower() for x in w._template_words()}
    suffixes = {x.lower() for x in w.COMPANY_SUFFIXES + w.UNIVERSITY_SUFFIXES}
    # Suffixes must not double as template words, even when lower-cased.
    assert not suffixes & template_words
    for word in pool_words:
        assert word.isalpha() and word[0].isupper() and word[1:].islower(), word
        assert word.lower() not in template_words and word.lower() not in suffixes, word


def test_sizes_and_names_unique(world):
    cfg = world.config
    kinds = [_kind(d["id"]) for d in world.docs]
    assert kinds.count("p") == cfg.n_clusters * cfg.people_per_cluster
    assert kinds.count("c") == cfg.n_clusters * cfg.companies_per_cluster
    assert kinds.count("u") == cfg.n_clusters * cfg.universities_per_cluster
    assert kinds.count("city") == cfg.n_cities
    assert kinds.count("n") == cfg.n_countries
    titles = [d["title"] for d in world.docs]
    assert len(set(titles)) == len(titles)
    ids = [d["id"] for d in world.docs]
    assert len(set(ids)) == len(ids)
    qids = [q["id"] for q in _questions(world)]
    assert len(set(qids)) == len(qids)
    for doc in world.docs:
        assert doc["contents"] == doc["title"] + "\n" + doc["text"]
        assert len(doc["text"].split()) <= 26


def test_question_counts_and_hops(world):
    cfg = world.config
    n_people = cfg.n_clusters * cfg.people_per_cluster
    n_companies = cfg.n_clusters * cfg.companies_per_cluster
    assert len(_questions(world)) == n_people * 5 + n_companies * 2
    assert {q["metadata"]["type"] for q in world.test} == set(PATHS)
    assert {q["metadata"]["hops"] for q in world.test} == {2, 3}
    for q in _questions(world):
        assert q["metadata"]["hops"] == len(PATHS[q["metadata"]["type"]]) == len(q["metadata"]["chain"])


def test_split_has_no_entity_leakage(world):
    cfg = world.config
    first_test = cfg.n_clusters - cfg.test_clusters
    for q in world.train:
        assert q["metadata"]["split"] == "train" and q["metadata"]["cluster"] < first_test
    for q in world.test:
        assert q["metadata"]["split"] == "test" and q["metadata"]["cluster"] >= first_test

    clustered = {d["title"] for d in world.docs if _kind(d["id"]) in ("p", "c", "u")}
    test_names = set()
    for q in world.test:
        for hop in q["metadata"]["chain"]:
            subject = _split_query(hop["query"])[0]
            test_names.update(n for n in (subject, hop["value"]) if n in clustered)
    assert test_names
    train_texts = []
    for q in world.train:
        train_texts.append(q["question"])
        for hop in q["metadata"]["chain"]:
            train_texts += [hop["query"], hop["fact"], hop["value"]]
    # "|" never occurs in names, so a name cannot match across two texts.
    train_blob = " | ".join(train_texts)
    for name in test_names:
        assert not _contains(train_blob, name), name


def test_all_tokens_in_vocabulary(world):
    vocab = set(world_vocabulary())
    texts = [d["title"] for d in world.docs] + [d["text"] for d in world.docs]
    for q in _questions(world):
        texts.append(q["question"])
        texts += q["golden_answers"]
        for hop in q["metadata"]["chain"]:
            texts += [hop["query"], hop["fact"], hop["value"]]
    for text in texts:
        for token in text.split():
            assert token in vocab, (token, text)


def test_chain_queries_hit_target_doc(world):
    by_id = {d["id"]: d for d in world.docs}
    for q in _questions(world):
        meta = q["metadata"]
        assert meta["supporting_docs"] == [hop["doc_id"] for hop in meta["chain"]]
        for hop in meta["chain"]:
            doc = by_id[hop["doc_id"]]
            name, phrase = _split_query(hop["query"])
            assert doc["title"] == name
            assert f"{name} {phrase} {hop['value']} ." in doc["text"], (phrase, doc["text"])
            assert hop["fact"] == f"{name} {phrase} {hop['value']} ."
            assert _contains(doc["text"], name)
            assert _contains(doc["text"], hop["value"])
            assert _contains(hop["fact"], name) and _contains(hop["fact"], hop["value"])
            assert len(hop["query"].split()) <= 8


def test_every_keyword_in_every_template():
    from r3rag.data import world as w

    needed = {
        "person": ("born", "works", "studied"),
        "company": ("headquartered", "founded", "founder"),
        "university": ("located",),
        "city": ("country",),
    }
    for kind, keywords in needed.items():
        for template in w.DOC_TEMPLATES[kind]:
            for keyword in keywords:
                assert keyword in template.split(), (kind, keyword, template)


def test_answers_match_parsed_docs(world):
    facts = _parse_facts(world)
    titles = [d["title"] for d in world.docs]
    for q in _questions(world):
        meta = q["metadata"]
        assert q["golden_answers"] == [meta["chain"][-1]["value"]]
        subject = _split_query(meta["chain"][0]["query"])[0]
        assert _contains(q["question"], subject)
        # The question names its subject and nothing else.
        assert [t for t in titles if _contains(q["question"], t)] == [subject]
        current = subject
        for relation in PATHS[meta["type"]]:
            current = facts[current][relation]
        assert q["golden_answers"] == [current], q


def test_founders_and_employers_stay_in_cluster(world):
    facts = _parse_facts(world)
    cluster_of = {}
    for q in _questions(world):
        for hop in q["metadata"]["chain"]:
            name = _split_query(hop["query"])[0]
            if _kind(hop["doc_id"]) in ("p", "c"):
                cluster_of[name] = q["metadata"]["cluster"]
    for name, parsed in facts.items():
        for relation in ("works", "founder"):
            if relation in parsed and name in cluster_of:
                assert cluster_of[parsed[relation]] == cluster_of[name]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(people_per_cluster=2000),
        dict(companies_per_cluster=50),
        dict(universities_per_cluster=4),
        dict(n_cities=301),
        dict(n_countries=61),
        dict(test_clusters=61),
    ],
)
def test_too_many_names_raise(overrides):
    with pytest.raises(ValueError):
        generate_world(WorldConfig(**overrides))


def test_default_config_sizes():
    """The default world's size (its generation time is benchmarks/world_speed.py's figure)."""
    w = generate_world(WorldConfig())
    # one document per fact: 3 per person and company, 1 per university, city, country
    assert len(w.docs) == 3 * 2400 + 3 * 480 + 180 + 120 + 30
    assert {q["metadata"]["hops"] for q in w.test} == {2, 3}


def test_fact_documents_are_the_chain_facts():
    """doc_unit="fact": every hop's document is exactly the fact the model restates."""
    w = generate_world(WorldConfig(seed=4, **{**SMALL, "doc_unit": "fact"}))
    by_id = {d["id"]: d for d in w.docs}
    assert len(by_id) == len(w.docs)
    for q in w.train + w.test:
        for hop in q["metadata"]["chain"]:
            assert by_id[hop["doc_id"]]["text"] == hop["fact"]
            assert hop["fact"].startswith(hop["query"] + " ")


def test_fact_unit_needs_fact_sentences():
    with pytest.raises(ValueError, match="doc_unit='fact' needs doc_style='facts'"):
        generate_world(WorldConfig(doc_style="prose"))


HARD = WorldConfig(seed=3, n_clusters=8, test_clusters=2, paraphrases=3, question_types="all")


def test_harder_world_paraphrases_and_longer_chains():
    from r3rag.data.world import FIRST_NAMES, LAST_NAMES, RELATION_PARAPHRASES, _extra_words
    from r3rag.retrieval.bm25 import BM25Retriever

    w = generate_world(HARD)
    by_id = {d["id"]: d for d in w.docs}
    phrasings = {p for group in RELATION_PARAPHRASES.values() for p in group[1:]}
    assert sum(any(f" {p} " in d["text"] for p in phrasings) for d in w.docs) > len(w.docs) // 2
    assert {q["metadata"]["hops"] for q in w.test} == {2, 3, 4}
    qs = w.test[:150]
    for q in qs:  # the restatement copies what the document says, and the chain ends at the answer
        chain = q["metadata"]["chain"]
        assert [h["fact"] for h in chain] == [by_id[h["doc_id"]]["text"] for h in chain]
        assert chain[-1]["value"] == q["golden_answers"][0]
    hops = [h for q in qs for h in q["metadata"]["chain"]]
    rows = BM25Retriever.build(w.docs).search([h["query"] for h in hops], 3)
    found = [h["doc_id"] in [x.doc_id for x in row] for h, row in zip(hops, rows)]
    first = [h["doc_id"] == row[0].doc_id for h, row in zip(hops, rows)]
    assert sum(found) >= 0.98 * len(hops)  # the canonical query still finds the paraphrased fact...
    assert sum(first) <= 0.9 * len(hops)  # ...but not always first: the model must read which answers
    vocab = set(world_vocabulary(HARD))
    for text in [d["text"] for d in w.docs] + [q["question"] for q in w.test + w.train]:
        assert set(text.split()) <= vocab, text
    extra = set(_extra_words())
    assert extra and not extra & set(world_vocabulary())  # basic worlds keep their vocabulary
    assert not {x.lower() for x in extra} & {n.lower() for n in FIRST_NAMES + LAST_NAMES}


def test_world_config_rejects_bad_harder_settings():
    with pytest.raises(ValueError, match="paraphrases"):
        generate_world(WorldConfig(paraphrases=4))
    with pytest.raises(ValueError, match="question_types"):
        generate_world(WorldConfig(question_types="hard"))


def test_world_speed_benchmark_prints_its_figures():
    """The benchmark the wall-clock check moved to still runs and ends with its one line of JSON
    (the figure itself is not checked: timings on a shared machine mean nothing)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "world_speed.py"
    out = subprocess.run([sys.executable, str(script), "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["docs"] == 3 * 2400 + 3 * 480 + 180 + 120 + 30 and figures["repeats"] == 1
    assert figures["world_default_seconds"] > 0
    assert figures["world_budget_ratio"] == pytest.approx(figures["world_default_seconds"] / 2.0, abs=1e-3)
