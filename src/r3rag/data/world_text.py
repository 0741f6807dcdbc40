"""The synthetic world's text: document, fact and question templates, relation phrasings, the
name pools and the vocabulary every world can emit (r3rag.data.world builds worlds from them).

Usage::

    from r3rag.data.world_text import RELATION_PHRASES, QUESTION_TEMPLATES, world_vocabulary

    RELATION_PHRASES["works"]        # "works for": a hop's query is "<subject> <phrase>"
    vocab = world_vocabulary()       # every token any seed of a basic world can produce

Name pools are generated once with a FIXED seed, so they (and the vocabulary) are the same for
every world seed; a tokenizer trained on the vocabulary covers any world with those features.
"""

from __future__ import annotations

import random
import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r3rag.data.world_config import WorldConfig

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
_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "tr",
    "st",
    "gr",
    "th",
    "sh",
)
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


def _is_basic(config: WorldConfig | None) -> bool:
    return config is None or (config.paraphrases <= 1 and config.question_types == "basic")


def world_vocabulary(config: WorldConfig | None = None) -> list[str]:
    """Every token that any world (any seed) with this config's features can emit, in a
    deterministic order. Basic worlds (the default) never use the harder worlds' extra words, so
    their vocabulary, and a tokenizer trained on it, stay as they were."""
    from r3rag.data.world_long import long_words

    extra = ([] if _is_basic(config) else _extra_words()) + (long_words() if config and config.long_horizon else [])
    tokens: dict[str, None] = {}
    for group in (
        PUNCTUATION,
        _template_words() + extra,
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


# Named questions (`WorldConfig.named`): the chain question followed by ", where the <role> is
# <name> and ..." for every entity between the subject and the answer, so one retrieval of the
# question text can find the one fact that answers it. Role nouns by the relation that reached
# the entity; only relations that can end a non-final hop appear. Every word is already a basic
# template word, so the vocabulary (and any tokenizer trained on it) does not change.
ROLE_NOUNS = {
    "works": "company",
    "studied": "school",
    "founder": "founder",
    "born": "city",
    "headquartered": "city",
    "located": "city",
}
NAMED_JOIN = ("where", "the", "is", "and")
assert set(ROLE_NOUNS.values()) | set(NAMED_JOIN) <= set(_template_words())
