"""Procedurally generated fictional world for multi-hop retrieval training.

Every entity (person, company, university, city, country) gets one short document (or one per
fact); questions are 2- to 4-hop compositions of the facts in those documents, each with a gold
retrieval chain (query -> doc -> fact -> value). All names are invented, so a model can only
answer by retrieving.

Usage::

    from r3rag.data.world import WorldConfig, generate_world, world_vocabulary

    world = generate_world(WorldConfig(seed=0, dev_clusters=6, named=0.25))
    world.docs[0]   # {"id": "p0000", "title": ..., "text": ..., "contents": ...}
    world.train[0]  # {"id": "q000123", "question": ..., "golden_answers": [...],
                    #  "metadata": {"type", "hops", "split", "cluster",
                    #               "supporting_docs", "chain"}}
    world.splits    # {"train": [...], "dev": [...], "test": [...]}
    vocab = world_vocabulary()  # every token any seed can produce

All text is space-separated tokens (punctuation included, e.g.
"Ava Smith works for Zentro Labs ."), so ``text.split()`` tokenises it and
every token is in ``world_vocabulary()``.

Splits are by cluster: the last ``test_clusters`` clusters form the test split and the
``dev_clusters`` before them the dev split (for choosing settings; 0 = none). Clusters share no
people, companies or universities, so the entities in a dev or test question's chain never
occur in training questions. Cities, countries and years are global to the world and do occur
in every split. ``named`` adds, for that share of chain questions, a twin that names every
intermediate entity (see r3rag.data.world_questions). Neither setting changes the chain
questions: with both at 0 a world is what it was before they existed, and with them the test
split's chain questions and every chain question's id and text stay the same.

The settings are `WorldConfig` (r3rag.data.world_config), the text pools and templates
r3rag.data.world_text (both re-exported here), the question builders r3rag.data.world_questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from r3rag.data.world_config import WorldConfig, fresh_world_config, world_config_from
from r3rag.data.world_long import assign_mentors, check_long_horizon, long_questions, mentor_docs
from r3rag.data.world_questions import chain_question, fact_doc_id, with_named_twins
from r3rag.data.world_text import (  # noqa: F401  (re-exported: the world's text lives in world_text)
    CITY_NAMES,
    COMPANY_SUFFIXES,
    COMPANY_TEMPLATES,
    COMPANY_WORDS,
    COUNTRY_NAMES,
    COUNTRY_TEMPLATES,
    DOC_TEMPLATES,
    EXTRA_QUESTION_TEMPLATES,
    EXTRA_QUESTION_TYPES,
    FACT_TEMPLATES,
    FIRST_NAMES,
    LAST_NAMES,
    PUNCTUATION,
    QUESTION_TEMPLATES,
    QUESTION_TYPES,
    RELATION_PARAPHRASES,
    RELATION_PHRASES,
    UNIVERSITY_SUFFIXES,
    UNIVERSITY_WORDS,
    YEARS,
    _extra_words,
    _template_words,
    world_vocabulary,
)

__all__ = [
    "WorldConfig",
    "World",
    "generate_world",
    "world_vocabulary",
    "fresh_world_config",
    "chain_names",
    "world_config_from",
]


@dataclass
class World:
    config: WorldConfig
    docs: list[dict]
    train: list[dict]
    test: list[dict]
    dev: list[dict] = field(default_factory=list)

    @property
    def splits(self) -> dict[str, list[dict]]:
        return {"train": self.train, "dev": self.dev, "test": self.test}

    @property
    def questions(self) -> list[dict]:
        """Every question of every split (a fresh world's training material)."""
        return self.train + self.dev + self.test


@dataclass
class _Entity:
    name: str
    kind: str
    doc_id: str
    facts: dict  # relation keyword -> value (entity name or year)


def _validate(config: WorldConfig) -> None:
    if config.doc_style not in ("facts", "prose"):
        raise ValueError(f"WorldConfig.doc_style must be 'facts' or 'prose', got {config.doc_style!r}")
    if config.doc_unit not in ("fact", "entity"):
        raise ValueError(f"WorldConfig.doc_unit must be 'fact' or 'entity', got {config.doc_unit!r}")
    if config.doc_unit == "fact" and config.doc_style != "facts":
        raise ValueError("WorldConfig.doc_unit='fact' needs doc_style='facts'")
    if not 1 <= config.paraphrases <= 3:
        raise ValueError(f"WorldConfig.paraphrases must be 1, 2 or 3, got {config.paraphrases}")
    if config.question_types not in ("basic", "all"):
        raise ValueError(f"WorldConfig.question_types must be 'basic' or 'all', got {config.question_types!r}")
    if config.paraphrases > 1 and config.doc_unit != "fact":
        raise ValueError("WorldConfig.paraphrases > 1 needs doc_unit='fact'")
    if not 0.0 <= config.named <= 1.0:
        raise ValueError(f"WorldConfig.named must be a share in [0, 1], got {config.named}")
    check_long_horizon(config)
    positive = (
        "n_clusters",
        "people_per_cluster",
        "companies_per_cluster",
        "universities_per_cluster",
        "n_cities",
        "n_countries",
    )
    for field_name in positive:
        if getattr(config, field_name) < 1:
            raise ValueError(f"WorldConfig.{field_name} must be >= 1, got {getattr(config, field_name)}")
    for field_name in ("test_clusters", "dev_clusters"):
        if not 0 <= getattr(config, field_name) <= config.n_clusters:
            raise ValueError(
                f"WorldConfig.{field_name} must be in [0, n_clusters={config.n_clusters}], "
                f"got {getattr(config, field_name)}"
            )
    if config.test_clusters + config.dev_clusters > config.n_clusters:
        raise ValueError(
            f"WorldConfig: test_clusters + dev_clusters ({config.test_clusters} + "
            f"{config.dev_clusters}) exceed n_clusters={config.n_clusters}"
        )
    _check_capacity(config)


def _check_capacity(config: WorldConfig) -> None:
    """Unique-name capacity of each pool."""
    limits = (
        ("people", config.n_clusters * config.people_per_cluster, len(FIRST_NAMES) * len(LAST_NAMES)),
        ("companies", config.n_clusters * config.companies_per_cluster, len(COMPANY_WORDS) * len(COMPANY_SUFFIXES)),
        (
            "universities",
            config.n_clusters * config.universities_per_cluster,
            len(UNIVERSITY_WORDS) * len(UNIVERSITY_SUFFIXES),
        ),
        ("cities", config.n_cities, len(CITY_NAMES)),
        ("countries", config.n_countries, len(COUNTRY_NAMES)),
    )
    for what, asked, available in limits:
        if asked > available:
            raise ValueError(
                f"WorldConfig asks for {asked} unique {what} but the name pools allow only "
                f"{available}; reduce the config"
            )


def _person_names(rng: random.Random, count: int) -> list[str]:
    # Sampling indices of the first x last grid guarantees unique full names.
    n_last = len(LAST_NAMES)
    picks = rng.sample(range(len(FIRST_NAMES) * n_last), count)
    return [f"{FIRST_NAMES[i // n_last]} {LAST_NAMES[i % n_last]}" for i in picks]


def _compound_names(rng: random.Random, words: tuple[str, ...], suffixes: tuple[str, ...], count: int) -> list[str]:
    """Unique "<word> <suffix>" names that reuse a word only when unavoidable.

    Reusing words as little as possible keeps BM25 retrieval unambiguous: the
    word token alone then almost always identifies the entity.
    """
    order = list(words)
    rng.shuffle(order)
    suffix_orders = {word: rng.sample(suffixes, len(suffixes)) for word in order}
    names: list[str] = []
    for round_index in range(len(suffixes)):
        for word in order:
            if len(names) == count:
                break
            names.append(f"{word} {suffix_orders[word][round_index]}")
    # Shuffle so the clusters that get re-used words are random.
    rng.shuffle(names)
    return names


def _assign_countries(rng: random.Random, cities: list[str], countries: list[str]) -> list[str]:
    # Give every country at least one city when there are enough cities.
    assignment = list(countries[: len(cities)])
    assignment += [rng.choice(countries) for _ in range(len(cities) - len(assignment))]
    rng.shuffle(assignment)
    return assignment


def _make_doc(rng: random.Random, entity: _Entity, style: str) -> dict:
    if style == "prose":
        text = rng.choice(DOC_TEMPLATES[entity.kind]).format(name=entity.name, **entity.facts)
    elif entity.facts:
        # One sentence per fact, in random order.
        sentences = [FACT_TEMPLATES[k].format(s=entity.name, v=v) for k, v in entity.facts.items()]
        rng.shuffle(sentences)
        text = " ".join(sentences)
    else:
        text = rng.choice(COUNTRY_TEMPLATES).format(name=entity.name)
    return {"id": entity.doc_id, "title": entity.name, "text": text, "contents": entity.name + "\n" + text}


def _fact_docs(entity: _Entity, rng: random.Random | None = None, paraphrases: int = 1) -> list[dict]:
    """One document per fact, id "<entity id>-<relation>"; a country gets one plain doc.
    With `paraphrases` > 1 each fact is stated with one of that many phrasings (rng's pick)."""
    if not entity.facts:
        text = COUNTRY_TEMPLATES[0].format(name=entity.name)
        return [{"id": entity.doc_id, "title": entity.name, "text": text, "contents": entity.name + "\n" + text}]
    docs = []
    for keyword, value in entity.facts.items():
        phrase = (
            rng.choice(RELATION_PARAPHRASES[keyword][:paraphrases]) if paraphrases > 1 else RELATION_PHRASES[keyword]
        )
        text = f"{entity.name} {phrase} {value} ."
        docs.append(
            {
                "id": fact_doc_id(entity, keyword),
                "title": entity.name,
                "text": text,
                "contents": entity.name + "\n" + text,
            }
        )
    return docs


def _cluster_entities(
    rng: random.Random,
    cities: list[str],
    c_people: list[str],
    c_companies: list[str],
    c_unis: list[str],
    counts: dict[str, int],
) -> list[_Entity]:
    """One cluster's universities, people and companies (facts drawn in this order: seeds rely on it)."""
    unis = []
    for name in c_unis:
        unis.append(_Entity(name, "university", f"u{counts['u']:04d}", {"located": rng.choice(cities)}))
        counts["u"] += 1
    people = []
    for name in c_people:
        people.append(
            _Entity(
                name,
                "person",
                f"p{counts['p']:04d}",
                {
                    "born": rng.choice(cities),
                    "works": rng.choice(c_companies),
                    "studied": rng.choice(c_unis),
                },
            )
        )
        counts["p"] += 1
    # Distinct founders when possible, so founder questions vary.
    if len(c_people) >= len(c_companies):
        founders = rng.sample(c_people, len(c_companies))
    else:
        founders = [rng.choice(c_people) for _ in c_companies]
    companies = []
    for name, founder in zip(c_companies, founders):
        companies.append(
            _Entity(
                name,
                "company",
                f"c{counts['c']:04d}",
                {
                    "headquartered": rng.choice(cities),
                    "founder": founder,
                    "founded": rng.choice(YEARS),
                },
            )
        )
        counts["c"] += 1
    return unis + people + companies


def _entities(rng: random.Random, cfg: WorldConfig) -> tuple[list[_Entity], list[tuple[list[str], list[str]]]]:
    """Every entity (people, companies, universities, cities, countries, in that order) and, per
    cluster, its (people, companies) names for the questions."""
    cities = rng.sample(CITY_NAMES, cfg.n_cities)
    countries = rng.sample(COUNTRY_NAMES, cfg.n_countries)
    city_country = _assign_countries(rng, cities, countries)
    people = _person_names(rng, cfg.n_clusters * cfg.people_per_cluster)
    companies = _compound_names(rng, COMPANY_WORDS, COMPANY_SUFFIXES, cfg.n_clusters * cfg.companies_per_cluster)
    universities = _compound_names(
        rng, UNIVERSITY_WORDS, UNIVERSITY_SUFFIXES, cfg.n_clusters * cfg.universities_per_cluster
    )
    by_kind: dict[str, list[_Entity]] = {"person": [], "company": [], "university": []}
    clusters = []
    counts = {"p": 0, "c": 0, "u": 0}
    for k in range(cfg.n_clusters):
        c_people = people[k * cfg.people_per_cluster : (k + 1) * cfg.people_per_cluster]
        c_companies = companies[k * cfg.companies_per_cluster : (k + 1) * cfg.companies_per_cluster]
        c_unis = universities[k * cfg.universities_per_cluster : (k + 1) * cfg.universities_per_cluster]
        clusters.append((c_people, c_companies))
        for ent in _cluster_entities(rng, cities, c_people, c_companies, c_unis, counts):
            by_kind[ent.kind].append(ent)
    city_ents = [
        _Entity(name, "city", f"city{i:04d}", {"country": country})
        for i, (name, country) in enumerate(zip(cities, city_country))
    ]
    country_ents = [_Entity(name, "country", f"n{i:04d}", {}) for i, name in enumerate(countries)]
    return by_kind["person"] + by_kind["company"] + by_kind["university"] + city_ents + country_ents, clusters


def _split_of(cfg: WorldConfig, cluster: int) -> str:
    first_test = cfg.n_clusters - cfg.test_clusters
    if cluster >= first_test:
        return "test"
    return "dev" if cluster >= first_test - cfg.dev_clusters else "train"


def _chain_questions(
    rng: random.Random, cfg: WorldConfig, entities: dict[str, _Entity], clusters, doc_text: dict[str, str] | None
) -> dict[str, list[dict]]:
    """Every chain question by split, each split shuffled. Dev comes out of the shuffled
    training pool, so train and test see the same draws whatever `dev_clusters` is."""
    types = {**QUESTION_TYPES, **(EXTRA_QUESTION_TYPES if cfg.question_types == "all" else {})}
    person_types = [t for t, (kind, _p) in types.items() if kind == "person"]
    company_types = [t for t, (kind, _p) in types.items() if kind == "company"]
    pool: list[dict] = []
    test: list[dict] = []
    counter = 0
    for k, (c_people, c_companies) in enumerate(clusters):
        split = _split_of(cfg, k)
        subjects = [(p, t) for p in c_people for t in person_types]
        subjects += [(c, t) for c in c_companies for t in company_types]
        for subject, qtype in subjects:
            q = chain_question(rng, entities, f"q{counter:06d}", qtype, subject, split, k, cfg.doc_unit, doc_text)
            (test if split == "test" else pool).append(q)
            counter += 1
    # Shuffle so any prefix of a split mixes clusters and question types.
    rng.shuffle(pool)
    rng.shuffle(test)
    return {
        "train": [q for q in pool if q["metadata"]["split"] == "train"],
        "dev": [q for q in pool if q["metadata"]["split"] == "dev"],
        "test": test,
    }


def generate_world(config: WorldConfig) -> World:
    """Build the world for ``config``; identical config gives identical output."""
    _validate(config)
    rng = random.Random(config.seed)
    all_ents, clusters = _entities(rng, config)
    entities = {ent.name: ent for ent in all_ents}
    if config.doc_unit == "fact":
        docs = [doc for ent in all_ents for doc in _fact_docs(ent, rng, config.paraphrases)]
    else:
        docs = [_make_doc(rng, ent, config.doc_style) for ent in all_ents]
    doc_text = {d["id"]: d["text"] for d in docs} if config.paraphrases > 1 else None
    splits = _chain_questions(rng, config, entities, clusters, doc_text)
    # Named twins draw from their own generator per split: the chain questions' draws stay as they were.
    splits = {
        name: with_named_twins(qs, config.named, random.Random(f"{config.seed}:named:{name}"))
        for name, qs in splits.items()
    }
    if config.long_horizon:  # opt-in, from generators of its own: the world above stays as it is
        mentors = assign_mentors(config.seed, clusters)
        docs += mentor_docs(mentors, entities)
        long = long_questions(config, entities, clusters, mentors, _split_of)
        splits = {name: qs + long[name] for name, qs in splits.items()}
    return World(config=config, docs=docs, **splits)


def chain_names(questions: list[dict]) -> set[str]:
    """People, companies and universities the questions' chains pass through. These names have
    two words; cities, countries and years (one word) are shared geography."""
    names = set()
    for q in questions:
        chain = q.get("metadata", {}).get("chain", [])
        if chain:
            names.add(" ".join(chain[0]["fact"].split()[:2]))  # the subject
        names.update(hop["value"] for hop in chain)
    return {n for n in names if len(n.split()) == 2}
