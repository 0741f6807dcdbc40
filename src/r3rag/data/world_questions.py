"""Questions of the synthetic world: relation chains, chain questions, named twins and splits.

A chain question names only its subject ("Where was the founder of Zentro Labs born ?"): the
intermediate entities must be found by searching, one hop at a time. A named twin
(`WorldConfig.named`) asks the same thing and names every intermediate entity ("..., where the
founder is Ava Smith ?"), so one retrieval of its text can find the single fact that answers
it: the question type single-shot RAG can answer. Its metadata: `type: named`, `path` (the
chain's type), `hops: 1`, `stated` (leading chain hops the question states; the oracle teacher
skips them), `supporting_docs` (the answering fact's document) and the full `chain`.

Usage (r3rag.data.world calls these)::

    chain = relation_chain(entities, subject, ("works", "headquartered"), "fact", doc_text)
    q = chain_question(rng, entities, "q000001", "employer_city", subject, "train", 3, "fact", None)
    train = with_named_twins(train, share=0.25, rng=random.Random("1:named:train"))
"""

from __future__ import annotations

import random

from r3rag.data.world_text import (
    EXTRA_QUESTION_TEMPLATES,
    EXTRA_QUESTION_TYPES,
    FACT_TEMPLATES,
    QUESTION_TEMPLATES,
    QUESTION_TYPES,
    RELATION_PHRASES,
    ROLE_NOUNS,
)

ALL_TYPES = {**QUESTION_TYPES, **EXTRA_QUESTION_TYPES}


def fact_doc_id(entity, keyword: str) -> str:
    return f"{entity.doc_id}-{keyword}"


def relation_chain(
    entities: dict, subject: str, path: tuple[str, ...], doc_unit: str, doc_text: dict[str, str] | None = None
) -> list[dict]:
    """Follow the relation path from the subject, one hop per relation. The hop's `fact` is the
    sentence its document states (`doc_text` by doc id, for paraphrased worlds)."""
    hops = []
    current = subject
    for keyword in path:
        entity = entities[current]
        value = entity.facts[keyword]
        doc_id = fact_doc_id(entity, keyword) if doc_unit == "fact" else entity.doc_id
        hops.append(
            {
                "doc_id": doc_id,
                "query": f"{current} {RELATION_PHRASES[keyword]}",
                "fact": (doc_text or {}).get(doc_id) or FACT_TEMPLATES[keyword].format(s=current, v=value),
                "value": value,
            }
        )
        current = value
    return hops


def chain_question(
    rng: random.Random,
    entities: dict,
    qid: str,
    qtype: str,
    subject: str,
    split: str,
    cluster: int,
    doc_unit: str,
    doc_text: dict[str, str] | None,
) -> dict:
    _kind, path = ALL_TYPES[qtype]
    chain = relation_chain(entities, subject, path, doc_unit, doc_text)
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


def named_twin(q: dict) -> dict:
    """The chain question `q` with every intermediate entity named: its answer is one fact away."""
    meta = q["metadata"]
    _kind, path = ALL_TYPES[meta["type"]]
    chain = meta["chain"]
    roles = [f"the {ROLE_NOUNS[keyword]} is {hop['value']}" for keyword, hop in zip(path, chain[:-1])]
    text = q["question"].removesuffix(" ?") + " , where " + " and ".join(roles) + " ?"
    return {
        "id": "n" + q["id"][1:],  # q000123's twin is n000123: ids never collide, and the pair is visible
        "question": text,
        "golden_answers": list(q["golden_answers"]),
        "metadata": {
            "type": "named",
            "path": meta["type"],
            "hops": 1,  # one retrieval: by_hops then keeps the chain questions' 2/3/4-hop figures apart
            "split": meta["split"],
            "cluster": meta["cluster"],
            "supporting_docs": [chain[-1]["doc_id"]],
            "chain": chain,
            "stated": len(chain) - 1,
        },
    }


def with_named_twins(questions: list[dict], share: float, rng: random.Random) -> list[dict]:
    """`questions` with a named twin for about `share` of them, twins at random places. The
    chain questions keep their relative order, so a prefix still draws them as before."""
    if share <= 0:
        return questions
    twins = [named_twin(q) for q in questions if rng.random() < share]
    rng.shuffle(twins)  # a twin need not sit near its chain question
    total = len(questions) + len(twins)
    at = set(rng.sample(range(total), len(twins)))
    chain_iter, twin_iter = iter(questions), iter(twins)
    return [next(twin_iter) if i in at else next(chain_iter) for i in range(total)]
