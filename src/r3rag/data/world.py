"""Procedurally generated fictional world for multi-hop retrieval training.

Every entity (person, company, university, city, country) gets one short
document; questions are 2- or 3-hop compositions of the facts in those
documents, each with a gold retrieval chain (query -> doc -> fact -> value).
All names are invented, so a model can only answer by retrieving.

Usage::

    from r3rag.data.world import WorldConfig, generate_world, world_vocabulary

    world = generate_world(WorldConfig(seed=0))
    world.docs[0]   # {"id": "p0000", "title": ..., "text": ..., "contents": ...}
    world.train[0]  # {"id": "q000123", "question": ..., "golden_answers": [...],
                    #  "metadata": {"type", "hops", "split", "cluster",
                    #               "supporting_docs", "chain"}}
    vocab = world_vocabulary()  # every token any seed can produce

All text is space-separated tokens (punctuation included, e.g.
"Ava Smith works for Zentro Labs ."), so ``text.split()`` tokenises it and
every token is in ``world_vocabulary()``.

The last ``test_clusters`` clusters form the test split.  Clusters share no
people, companies or universities, so the entities in a test question's
chain never occur in training questions.  Cities, countries and years are
global to the world and do occur in both splits.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

__all__ = ["WorldConfig", "World", "generate_world", "world_vocabulary", "fresh_world_config", "chain_names",
           "world_config_from"]

# ---------------------------------------------------------------------------
# Templates.  Placeholders are named after the relation keyword they hold, so
# a document template can be filled straight from an entity's facts dict.
# ---------------------------------------------------------------------------

PUNCTUATION = (".", ",", ";", "?")

# "Industries" replaces the suggested "Works": lower-casing retrievers would
# otherwise confuse the suffix with the relation keyword "works".
COMPANY_SUFFIXES = ("Labs", "Systems", "Group", "Industries", "Foods", "Motors", "Media", "Energy")
UNIVERSITY_SUFFIXES = ("University", "Institute")
YEARS = tuple(str(year) for year in range(1900, 2021))

# Every person template contains "born", "works" and "studied" verbatim so a
# BM25 query "<name> <keyword>" always matches the person's own document.
PERSON_TEMPLATES = (
    "{name} was born in {born} , works for {works} and studied at {studied} .",
    "{name} , born in {born} , studied at {studied} and now works for {works} .",
    "{name} studied at {studied} , works for {works} and was born in {born} .",
    "{name} works for {works} , studied at {studied} and was born in {born} .",
)
# Every company template contains "headquartered", "founded" and "founder".
COMPANY_TEMPLATES = (
    "{name} is headquartered in {headquartered} and was founded in {founded} by its founder {founder} .",
    "{name} , founded in {founded} by founder {founder} , is headquartered in {headquartered} .",
    "{name} was founded in {founded} ; its founder is {founder} and it is headquartered in {headquartered} .",
    "{name} is headquartered in {headquartered} ; founder {founder} founded it in {founded} .",
)
# Templates say "school", never "university": the suffix "University" would
# otherwise collide with a template word in lower-casing retrievers.
UNIVERSITY_TEMPLATES = (
    "{name} is located in {located} .",
    "{name} is a school located in {located} .",
    "The campus of {name} is located in {located} .",
)
CITY_TEMPLATES = (
    "{name} is a city in the country of {country} .",
    "The city of {name} lies in the country {country} .",
    "{name} belongs to the country {country} .",
)
COUNTRY_TEMPLATES = (
    "{name} is a country .",
    "{name} is a small country .",
)

DOC_TEMPLATES = {
    "person": PERSON_TEMPLATES,
    "company": COMPANY_TEMPLATES,
    "university": UNIVERSITY_TEMPLATES,
    "city": CITY_TEMPLATES,
    "country": COUNTRY_TEMPLATES,
}

# Relation keyword -> the phrase between subject and value. A fact is stated as
# "<subject> <phrase> <value> ." both in "facts" documents and in the restatement the
# model writes after a search, and a hop's query is "<subject> <phrase>": so the model
# can restate a fact by copying it from the retrieved document. The keyword is also the
# key in an entity's facts dict, and every phrase contains it (BM25 finds the doc).
RELATION_PHRASES = {
    "works": "works for",
    "studied": "studied at",
    "born": "was born in",
    "headquartered": "is headquartered in",
    "founder": "was founded by",
    "founded": "was founded in",
    "located": "is located in",
    "country": "is a city in the country",
}
FACT_TEMPLATES = {k: "{s} " + phrase + " {v} ." for k, phrase in RELATION_PHRASES.items()}

# Harder worlds (`paraphrases` > 1): other ways documents state a relation. Queries keep the
# canonical phrase, so a search matches the document on the names and the keyword only and the
# model must read which retrieved sentence answers it; the restatement copies the sentence read.
# Each keeps its relation's keyword (BM25 still ranks the right fact above the entity's others).
RELATION_PARAPHRASES = {
    "works": ("works for", "works as an employee of", "has long worked for the firm"),
    "studied": ("studied at", "once studied at the school", "is a former student who studied at"),
    "born": ("was born in", "was born and raised in", "was born in the city of"),
    "headquartered": ("is headquartered in", "has its main office headquartered in", "is headquartered today in"),
    "founder": ("was founded by", "was founded long ago by", "was founded by the entrepreneur"),
    "founded": ("was founded in", "was founded in the year", "was first founded in"),
    "located": ("is located in", "is located in the city of", "has its campus located in"),
    "country": ("is a city in the country", "is a city that lies in the country", "is a city within the country"),
}
assert all(RELATION_PARAPHRASES[k][0] == RELATION_PHRASES[k] for k in RELATION_PHRASES)

# Question type -> (subject kind, relation path).  Hops = len(path).
QUESTION_TYPES = {
    "employer_city": ("person", ("works", "headquartered")),
    "employer_country": ("person", ("works", "headquartered", "country")),
    "school_city": ("person", ("studied", "located")),
    "founder_birthplace": ("company", ("founder", "born")),
    "founder_school": ("company", ("founder", "studied")),
    "employer_founded": ("person", ("works", "founded")),
    "employer_founder_birthplace": ("person", ("works", "founder", "born")),
}

# More types for harder worlds (`question_types: all`): longer chains, up to 4 hops.
EXTRA_QUESTION_TYPES = {
    "school_country": ("person", ("studied", "located", "country")),
    "founder_school_city": ("company", ("founder", "studied", "located")),
    "employer_founder_birth_country": ("person", ("works", "founder", "born", "country")),
    "founder_school_country": ("company", ("founder", "studied", "located", "country")),
}

# Questions name only the subject ({s}); intermediate entities stay hidden.
QUESTION_TEMPLATES = {
    "employer_city": (
        "In which city is the company that {s} works for headquartered ?",
        "Which city is the employer of {s} headquartered in ?",
        "Where is the company {s} works for headquartered ?",
    ),
    "employer_country": (
        "In which country is the company that {s} works for headquartered ?",
        "Which country is the employer of {s} headquartered in ?",
        "In what country is the company {s} works for headquartered ?",
    ),
    "school_city": (
        "In which city is the school where {s} studied located ?",
        "Where is the school that {s} studied at located ?",
        "Which city is the school of {s} located in ?",
    ),
    "founder_birthplace": (
        "Where was the founder of {s} born ?",
        "In which city was the founder of {s} born ?",
        "What is the birthplace of the founder of {s} ?",
    ),
    "founder_school": (
        "Where did the founder of {s} study ?",
        "Which school did the founder of {s} attend ?",
        "At which school did the founder of {s} study ?",
    ),
    "employer_founded": (
        "In which year was the company that {s} works for founded ?",
        "When was the employer of {s} founded ?",
        "What year was the company {s} works for founded ?",
    ),
    "employer_founder_birthplace": (
        "Where was the founder of the company that {s} works for born ?",
        "In which city was the founder of the employer of {s} born ?",
        "What is the birthplace of the founder of the company {s} works for ?",
    ),
}
EXTRA_QUESTION_TEMPLATES = {
    "school_country": (
        "In which country is the school where {s} studied located ?",
        "Which country is the school of {s} located in ?",
    ),
    "founder_school_city": (
        "In which city is the school where the founder of {s} studied located ?",
        "Where is the school that the founder of {s} attended located ?",
    ),
    "employer_founder_birth_country": (
        "In which country was the founder of the company that {s} works for born ?",
        "What is the birth country of the founder of the employer of {s} ?",
    ),
    "founder_school_country": (
        "In which country is the school where the founder of {s} studied located ?",
        "Which country is the school that the founder of {s} attended located in ?",
    ),
}


def _template_words() -> list[str]:
    """Literal (non-placeholder) tokens of every template, in first-seen order."""
    templates: list[str] = []
    for group in DOC_TEMPLATES.values():
        templates.extend(group)
    templates.extend(FACT_TEMPLATES.values())
    for group in QUESTION_TEMPLATES.values():
        templates.extend(group)
    words: dict[str, None] = {}
    for template in templates:
        for literal, _field, _spec, _conv in string.Formatter().parse(template):
            for token in literal.split():
                words[token] = None
    return list(words)


# ---------------------------------------------------------------------------
# Name pools.  Generated once from syllables with a FIXED seed, so they are
# identical for every world seed (and hence the vocabulary is too).
# ---------------------------------------------------------------------------

_POOL_SEED = 20240611
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "kr", "tr", "st", "gr", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
# Each pool has its own endings so the kind of a name is visible in its shape.
_POOL_SPECS = (
    # (pool name, size, endings)
    ("first", 300, ("na", "ra", "lia", "vin", "ren", "lo", "ta", "mir", "sa", "ric")),
    ("last", 300, ("rek", "vik", "dov", "mann", "sky", "nez", "gard", "wyn", "rov", "ssen")),
    ("city", 300, ("mar", "dor", "heim", "burg", "grad", "holm", "vale", "port", "mont", "quay")),
    ("country", 60, ("land", "ria", "stan", "via", "nia", "mark", "dora", "tia")),
    ("company", 300, ("tro", "tex", "nix", "lora", "vex", "tron", "mus", "lux", "dyne")),
    ("university", 100, ("wick", "ham", "ley", "ridge", "more", "well", "ton", "by")),
)


def _build_pools() -> dict[str, tuple[str, ...]]:
    rng = random.Random(_POOL_SEED)
    # Pool words must never collide with template words or suffixes, in any
    # casing, or a name could be confused with sentence structure.
    used = {w.lower() for w in _template_words()}
    used.update(w.lower() for w in COMPANY_SUFFIXES + UNIVERSITY_SUFFIXES)
    pools: dict[str, tuple[str, ...]] = {}
    for pool_name, size, endings in _POOL_SPECS:
        words: list[str] = []
        while len(words) < size:
            n_syllables = rng.choice((1, 2))
            stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n_syllables))
            word = (stem + rng.choice(endings)).capitalize()
            if word.lower() in used:
                continue
            used.add(word.lower())
            words.append(word)
        pools[pool_name] = tuple(words)
    return pools


_POOLS = _build_pools()
FIRST_NAMES = _POOLS["first"]
LAST_NAMES = _POOLS["last"]
CITY_NAMES = _POOLS["city"]
COUNTRY_NAMES = _POOLS["country"]
COMPANY_WORDS = _POOLS["company"]
UNIVERSITY_WORDS = _POOLS["university"]


def _extra_words() -> list[str]:
    """Tokens only harder worlds use (paraphrases, extra question types), not in the basic set."""
    basic = set(_template_words())
    texts = [p for group in RELATION_PARAPHRASES.values() for p in group]
    texts += [t for group in EXTRA_QUESTION_TEMPLATES.values() for t in group]
    words: dict[str, None] = {}
    for text in texts:
        for literal, _field, _spec, _conv in string.Formatter().parse(text):
            words.update((w, None) for w in literal.split() if w not in basic)
    return list(words)


def _is_basic(config: "WorldConfig | None") -> bool:
    return config is None or (config.paraphrases <= 1 and config.question_types == "basic")


def world_vocabulary(config: "WorldConfig | None" = None) -> list[str]:
    """Every token that any world (any seed) with this config's features can emit, in a
    deterministic order. Basic worlds (the default) never use the harder worlds' extra words, so
    their vocabulary, and a tokenizer trained on it, stay as they were."""
    tokens: dict[str, None] = {}
    for group in (
        PUNCTUATION,
        _template_words() + ([] if _is_basic(config) else _extra_words()),
        COMPANY_SUFFIXES,
        UNIVERSITY_SUFFIXES,
        YEARS,
        FIRST_NAMES,
        LAST_NAMES,
        CITY_NAMES,
        COUNTRY_NAMES,
        COMPANY_WORDS,
        UNIVERSITY_WORDS,
    ):
        for token in group:
            tokens[token] = None
    return list(tokens)


# ---------------------------------------------------------------------------
# World generation
# ---------------------------------------------------------------------------


@dataclass
class WorldConfig:
    seed: int = 0
    n_clusters: int = 60
    test_clusters: int = 6
    people_per_cluster: int = 40
    companies_per_cluster: int = 8
    universities_per_cluster: int = 3
    n_cities: int = 120
    n_countries: int = 30
    # "facts": one sentence per fact, each "<name> <relation phrase> <value> ." (copyable);
    # "prose": one varied sentence per entity stating all its facts (harder to read).
    doc_style: str = "facts"
    # "fact": one document per fact (a retrieved fact can be restated by copying it);
    # "entity": one document per entity holding all its facts.
    doc_unit: str = "fact"
    # Harder worlds: phrasings per relation in fact documents (1 = the canonical phrase only;
    # queries always use the canonical one), and "all" adds 3- and 4-hop question types.
    paraphrases: int = 1
    question_types: str = "basic"


@dataclass
class World:
    config: WorldConfig
    docs: list[dict]
    train: list[dict]
    test: list[dict]


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
    positive = ("n_clusters", "people_per_cluster", "companies_per_cluster",
                "universities_per_cluster", "n_cities", "n_countries")
    for field_name in positive:
        if getattr(config, field_name) < 1:
            raise ValueError(f"WorldConfig.{field_name} must be >= 1, got {getattr(config, field_name)}")
    if not 0 <= config.test_clusters <= config.n_clusters:
        raise ValueError(
            f"WorldConfig.test_clusters must be in [0, n_clusters={config.n_clusters}], "
            f"got {config.test_clusters}")
    # Unique-name capacity of each pool.
    limits = (
        ("people", config.n_clusters * config.people_per_cluster, len(FIRST_NAMES) * len(LAST_NAMES)),
        ("companies", config.n_clusters * config.companies_per_cluster,
         len(COMPANY_WORDS) * len(COMPANY_SUFFIXES)),
        ("universities", config.n_clusters * config.universities_per_cluster,
         len(UNIVERSITY_WORDS) * len(UNIVERSITY_SUFFIXES)),
        ("cities", config.n_cities, len(CITY_NAMES)),
        ("countries", config.n_countries, len(COUNTRY_NAMES)),
    )
    for what, asked, available in limits:
        if asked > available:
            raise ValueError(
                f"WorldConfig asks for {asked} unique {what} but the name pools allow only "
                f"{available}; reduce the config")


def _person_names(rng: random.Random, count: int) -> list[str]:
    # Sampling indices of the first x last grid guarantees unique full names.
    n_last = len(LAST_NAMES)
    picks = rng.sample(range(len(FIRST_NAMES) * n_last), count)
    return [f"{FIRST_NAMES[i // n_last]} {LAST_NAMES[i % n_last]}" for i in picks]


def _compound_names(rng: random.Random, words: tuple[str, ...], suffixes: tuple[str, ...],
                    count: int) -> list[str]:
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
    return {"id": entity.doc_id, "title": entity.name, "text": text,
            "contents": entity.name + "\n" + text}


def _fact_docs(entity: _Entity, rng: random.Random | None = None, paraphrases: int = 1) -> list[dict]:
    """One document per fact, id "<entity id>-<relation>"; a country gets one plain doc.
    With `paraphrases` > 1 each fact is stated with one of that many phrasings (rng's pick)."""
    if not entity.facts:
        text = COUNTRY_TEMPLATES[0].format(name=entity.name)
        return [{"id": entity.doc_id, "title": entity.name, "text": text, "contents": entity.name + "\n" + text}]
    docs = []
    for keyword, value in entity.facts.items():
        phrase = rng.choice(RELATION_PARAPHRASES[keyword][:paraphrases]) if paraphrases > 1 else RELATION_PHRASES[keyword]
        text = f"{entity.name} {phrase} {value} ."
        docs.append({"id": _fact_doc_id(entity, keyword), "title": entity.name, "text": text,
                     "contents": entity.name + "\n" + text})
    return docs


def _fact_doc_id(entity: _Entity, keyword: str) -> str:
    return f"{entity.doc_id}-{keyword}"


def _chain(entities: dict[str, _Entity], subject: str, path: tuple[str, ...], doc_unit: str,
           doc_text: dict[str, str] | None = None) -> list[dict]:
    """Follow the relation path from the subject, one hop per relation. The hop's `fact` is the
    sentence its document states (`doc_text` by doc id, for paraphrased worlds)."""
    hops = []
    current = subject
    for keyword in path:
        entity = entities[current]
        value = entity.facts[keyword]
        doc_id = _fact_doc_id(entity, keyword) if doc_unit == "fact" else entity.doc_id
        hops.append({
            "doc_id": doc_id,
            "query": f"{current} {RELATION_PHRASES[keyword]}",
            "fact": (doc_text or {}).get(doc_id) or FACT_TEMPLATES[keyword].format(s=current, v=value),
            "value": value,
        })
        current = value
    return hops


def _make_question(rng: random.Random, entities: dict[str, _Entity], qid: str, qtype: str,
                   subject: str, split: str, cluster: int, doc_unit: str, doc_text: dict[str, str] | None) -> dict:
    _kind, path = {**QUESTION_TYPES, **EXTRA_QUESTION_TYPES}[qtype]
    chain = _chain(entities, subject, path, doc_unit, doc_text)
    templates = QUESTION_TEMPLATES.get(qtype) or EXTRA_QUESTION_TEMPLATES[qtype]
    return {
        "id": qid,
        "question": rng.choice(templates).format(s=subject),
        "golden_answers": [chain[-1]["value"]],
        "metadata": {
            "type": qtype,
            "hops": len(path),
            "split": split,
            "cluster": cluster,
            "supporting_docs": [hop["doc_id"] for hop in chain],
            "chain": chain,
        },
    }


def generate_world(config: WorldConfig) -> World:
    """Build the world for ``config``; identical config gives identical output."""
    _validate(config)
    rng = random.Random(config.seed)
    cfg = config

    # Global geography.
    cities = rng.sample(CITY_NAMES, cfg.n_cities)
    countries = rng.sample(COUNTRY_NAMES, cfg.n_countries)
    city_country = _assign_countries(rng, cities, countries)

    people = _person_names(rng, cfg.n_clusters * cfg.people_per_cluster)
    companies = _compound_names(rng, COMPANY_WORDS, COMPANY_SUFFIXES,
                                cfg.n_clusters * cfg.companies_per_cluster)
    universities = _compound_names(rng, UNIVERSITY_WORDS, UNIVERSITY_SUFFIXES,
                                   cfg.n_clusters * cfg.universities_per_cluster)

    entities: dict[str, _Entity] = {}
    person_ents: list[_Entity] = []
    company_ents: list[_Entity] = []
    university_ents: list[_Entity] = []
    # Per cluster: (people names, company names) for question generation.
    clusters: list[tuple[list[str], list[str]]] = []

    for k in range(cfg.n_clusters):
        c_people = people[k * cfg.people_per_cluster:(k + 1) * cfg.people_per_cluster]
        c_companies = companies[k * cfg.companies_per_cluster:(k + 1) * cfg.companies_per_cluster]
        c_unis = universities[k * cfg.universities_per_cluster:(k + 1) * cfg.universities_per_cluster]
        clusters.append((c_people, c_companies))

        for name in c_unis:
            ent = _Entity(name, "university", f"u{len(university_ents):04d}",
                          {"located": rng.choice(cities)})
            university_ents.append(ent)
        for name in c_people:
            ent = _Entity(name, "person", f"p{len(person_ents):04d}", {
                "born": rng.choice(cities),
                "works": rng.choice(c_companies),
                "studied": rng.choice(c_unis),
            })
            person_ents.append(ent)
        # Distinct founders when possible, so founder questions vary.
        if len(c_people) >= len(c_companies):
            founders = rng.sample(c_people, len(c_companies))
        else:
            founders = [rng.choice(c_people) for _ in c_companies]
        for name, founder in zip(c_companies, founders):
            ent = _Entity(name, "company", f"c{len(company_ents):04d}", {
                "headquartered": rng.choice(cities),
                "founder": founder,
                "founded": rng.choice(YEARS),
            })
            company_ents.append(ent)

    city_ents = [_Entity(name, "city", f"city{i:04d}", {"country": country})
                 for i, (name, country) in enumerate(zip(cities, city_country))]
    country_ents = [_Entity(name, "country", f"n{i:04d}", {}) for i, name in enumerate(countries)]

    all_ents = person_ents + company_ents + university_ents + city_ents + country_ents
    for ent in all_ents:
        entities[ent.name] = ent
    if cfg.doc_unit == "fact":
        docs = [doc for ent in all_ents for doc in _fact_docs(ent, rng, cfg.paraphrases)]
    else:
        docs = [_make_doc(rng, ent, cfg.doc_style) for ent in all_ents]
    doc_text = {d["id"]: d["text"] for d in docs} if cfg.paraphrases > 1 else None

    types = {**QUESTION_TYPES, **(EXTRA_QUESTION_TYPES if cfg.question_types == "all" else {})}
    person_types = [t for t, (kind, _p) in types.items() if kind == "person"]
    company_types = [t for t, (kind, _p) in types.items() if kind == "company"]
    train: list[dict] = []
    test: list[dict] = []
    counter = 0
    for k, (c_people, c_companies) in enumerate(clusters):
        split = "test" if k >= cfg.n_clusters - cfg.test_clusters else "train"
        target = test if split == "test" else train
        subjects = [(p, t) for p in c_people for t in person_types]
        subjects += [(c, t) for c in c_companies for t in company_types]
        for subject, qtype in subjects:
            target.append(_make_question(rng, entities, f"q{counter:06d}", qtype, subject, split, k,
                                         cfg.doc_unit, doc_text))
            counter += 1

    # Shuffle so any prefix of a split mixes clusters and question types.
    rng.shuffle(train)
    rng.shuffle(test)
    return World(config=config, docs=docs, train=train, test=test)


def world_config_from(saved: dict) -> WorldConfig:
    """The WorldConfig inside a saved config (a world artifact's manifest), other keys ignored."""
    return WorldConfig(**{k: saved[k] for k in WorldConfig.__dataclass_fields__ if k in saved})


def fresh_world_config(base: WorldConfig, i: int, clusters: int = 0) -> WorldConfig:
    """The i-th freshly generated world beside `base` (training mixes, base-model text): the same
    settings, a seed disjoint from `base.seed`, and `clusters` clusters all in train (0 = as base)."""
    size = {"n_clusters": clusters, "test_clusters": 0} if clusters else {}
    return WorldConfig(**{**base.__dict__, "seed": base.seed * 100_003 + 7_919 * (i + 1), **size})


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
