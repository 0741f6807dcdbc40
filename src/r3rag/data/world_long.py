"""Long-horizon questions of the synthetic world: ones that need 1 to 40 searches each.

Opt-in (`WorldConfig.long_horizon: [lo, hi]`): a world without it is the world it always was,
word for word. With it, every person also has a mentor, one fact document each ("Ava Smith was
mentored by Ben Ruiz ."; within a cluster the mentors form one line through all its people), and
each split gets, for every search count n in [lo, hi], `long_per_count` questions of each type:

- `mentor_chain`: follow who each person was mentored by n - 1 times from a named person, then
  where the last one was born: n hops, each reading the one before ("Start from Ava Smith and
  follow who each person was mentored by , 5 times : in which city was the last person born ?").
- `founded_first`: which of n named companies was founded first (one search per company; where
  two share the earliest year, either is right).
- `count_before`: how many of n named companies were founded before a year (one search per
  company; the year is one of theirs, so the count is anywhere from 0 to n - 1).

Each carries the chain questions' metadata (type, hops = searches needed, split, cluster,
supporting_docs, chain of {doc_id, query, fact, value}), so the oracle teacher writes their
trajectories and eval's tables group them by hops; set questions say `independent: true` (no hop
reads the one before). Ids are "L" + six digits: never a chain question's. Everything draws from
generators of its own, seeded by the world's seed, so the rest of the world is untouched.

Usage (r3rag.data.world calls these)::

    docs = mentor_docs(mentors, entities)                      # the extra fact documents
    questions = long_questions(cfg, entities, clusters, mentors, split_of)  # {"train": [...], "dev": ..., "test": ...}
"""

from __future__ import annotations

import random

MENTOR = "mentor"
MENTOR_PHRASE = "was mentored by"
CHAIN_TEMPLATE = (
    "Start from {s} and follow who each person was mentored by , {n} times : in which city was the last person born ?"
)
FIRST_TEMPLATE = "Which of these companies was founded first : {members} ?"
COUNT_TEMPLATE = "How many of these companies were founded before {year} : {members} ?"
TYPES = ("mentor_chain", "founded_first", "count_before")
MAX_SEARCHES = 40


def long_words() -> list[str]:
    """Every literal token long-horizon questions and documents add (numbers included)."""
    words: dict[str, None] = {}
    for text in (MENTOR_PHRASE, CHAIN_TEMPLATE, FIRST_TEMPLATE, COUNT_TEMPLATE):
        for token in text.replace("{", " {").replace("}", "} ").split():
            if not token.startswith("{"):
                words[token] = None
    for n in range(MAX_SEARCHES + 1):
        words[str(n)] = None
    return list(words)


def check_long_horizon(cfg) -> None:
    if not cfg.long_horizon:
        return
    span = cfg.long_horizon
    if len(span) != 2 or not 1 <= span[0] <= span[1] <= MAX_SEARCHES:
        raise ValueError(f"WorldConfig.long_horizon must be [lo, hi] with 1 <= lo <= hi <= {MAX_SEARCHES}, got {span}")
    if cfg.doc_unit != "fact":
        raise ValueError("WorldConfig.long_horizon needs doc_unit='fact' (one document per fact)")
    if span[1] > cfg.people_per_cluster:
        raise ValueError(
            f"WorldConfig.long_horizon: a mentor chain of {span[1]} searches needs people_per_cluster >= "
            f"{span[1]}, got {cfg.people_per_cluster}"
        )
    sizes = [cfg.test_clusters, cfg.dev_clusters, cfg.n_clusters - cfg.test_clusters - cfg.dev_clusters]
    fewest = min(n for n in sizes if n) * cfg.companies_per_cluster
    if span[1] > fewest:
        raise ValueError(
            f"WorldConfig.long_horizon: a question over {span[1]} companies needs that many in every split; "
            f"the smallest has {fewest} (clusters x companies_per_cluster)"
        )
    if cfg.long_per_count < 1:
        raise ValueError(f"WorldConfig.long_per_count must be >= 1, got {cfg.long_per_count}")


def assign_mentors(seed: int, clusters) -> dict[str, str]:
    """Person -> mentor: per cluster one random line through all its people (the last has none),
    so a chain of up to people_per_cluster - 1 mentor hops never meets a person twice."""
    rng = random.Random(f"{seed}:long:mentors")
    mentors = {}
    for people, _companies in clusters:
        line = rng.sample(people, len(people))
        mentors.update(zip(line[:-1], line[1:]))
    return mentors


def mentor_docs(mentors: dict[str, str], entities: dict) -> list[dict]:
    docs = []
    for person, mentor in mentors.items():
        text = f"{person} {MENTOR_PHRASE} {mentor} ."
        doc_id = f"{entities[person].doc_id}-{MENTOR}"
        docs.append({"id": doc_id, "title": person, "text": text, "contents": person + "\n" + text})
    return docs


def _hop(entities: dict, subject: str, keyword: str, phrase: str, value: str) -> dict:
    return {
        "doc_id": f"{entities[subject].doc_id}-{keyword}",
        "query": f"{subject} {phrase}",
        "fact": f"{subject} {phrase} {value} .",
        "value": value,
    }


def long_questions(cfg, entities: dict, clusters, mentors: dict[str, str], split_of) -> dict[str, list[dict]]:
    """Every long-horizon question by split (ids L000000...), each split in a shuffled order;
    `split_of(cfg, cluster)` is the world's split rule."""
    lo, hi = cfg.long_horizon
    by_split: dict[str, list[tuple[int, list[str], list[str]]]] = {"train": [], "dev": [], "test": []}
    for k, (people, companies) in enumerate(clusters):
        by_split[split_of(cfg, k)].append((k, people, companies))
    out, counter = {}, 0
    for split, parts in by_split.items():
        rng = random.Random(f"{cfg.seed}:long:{split}")
        qs = []
        for n in range(lo, hi + 1):
            for qtype in TYPES:
                for _ in range(cfg.long_per_count if parts else 0):
                    q = BUILDERS[qtype](rng, entities, parts, mentors, n)
                    q["id"] = f"L{counter:06d}"
                    q["metadata"]["split"] = split
                    qs.append(q)
                    counter += 1
        rng.shuffle(qs)
        out[split] = qs
    return out


def _question(text: str, answers: list[str], qtype: str, chain: list[dict], cluster: int, independent: bool) -> dict:
    meta = {
        "type": qtype,
        "hops": len(chain),
        "cluster": cluster,
        "supporting_docs": [h["doc_id"] for h in chain],
        "chain": chain,
    }
    if independent:
        meta["independent"] = True
    return {"id": "", "question": text, "golden_answers": answers, "metadata": meta}


def _mentor_chain(rng, entities, parts, mentors, n: int) -> dict:
    """n - 1 mentor hops from a person whose line is long enough, then the last one's birthplace."""
    cluster, people, _ = rng.choice(parts)
    starts = [p for p in people if _line_length(p, mentors) >= n - 1]
    person = subject = rng.choice(starts)
    chain = []
    for _ in range(n - 1):
        chain.append(_hop(entities, person, MENTOR, MENTOR_PHRASE, mentors[person]))
        person = mentors[person]
    chain.append(_hop(entities, person, "born", "was born in", entities[person].facts["born"]))
    text = CHAIN_TEMPLATE.format(s=subject, n=n - 1)
    return _question(text, [chain[-1]["value"]], "mentor_chain", chain, cluster, independent=False)


def _line_length(person: str, mentors: dict[str, str]) -> int:
    length = 0
    while person in mentors:
        person, length = mentors[person], length + 1
    return length


def _members(rng, parts, index: int, n: int) -> tuple[int, list[str]]:
    """n distinct people (index 1) or companies (2) of the split: one cluster's when it has enough,
    else from all its clusters (cluster -1)."""
    cluster, *pools = rng.choice(parts)
    pool = pools[index - 1]
    if len(pool) < n:  # from every cluster of the split
        cluster, pool = -1, [x for part in parts for x in part[index]]
    return cluster, rng.sample(pool, n)


def _founded_first(rng, entities, parts, mentors, n: int) -> dict:
    cluster, companies = _members(rng, parts, 2, n)
    years = [int(entities[c].facts["founded"]) for c in companies]
    first = [c for c, y in zip(companies, years) if y == min(years)]  # a tie: each of them is right
    chain = [_hop(entities, c, "founded", "was founded in", entities[c].facts["founded"]) for c in companies]
    text = FIRST_TEMPLATE.format(members=" , ".join(companies))
    return _question(text, first, "founded_first", chain, cluster, independent=True)


def _count_before(rng, entities, parts, mentors, n: int) -> dict:
    cluster, companies = _members(rng, parts, 2, n)
    years = [int(entities[c].facts["founded"]) for c in companies]
    year = rng.choice(years)  # one of theirs: the count is 0 to n - 1, none of them a safe guess
    chain = [_hop(entities, c, "founded", "was founded in", entities[c].facts["founded"]) for c in companies]
    text = COUNT_TEMPLATE.format(year=year, members=" , ".join(companies))
    return _question(text, [str(sum(y < year for y in years))], "count_before", chain, cluster, independent=True)


BUILDERS = {"mentor_chain": _mentor_chain, "founded_first": _founded_first, "count_before": _count_before}
