"""The synthetic world's settings: `WorldConfig`, and the configs derived from a saved one.

`r3rag world`'s Config extends `WorldConfig` (the same keys); r3rag.data.world generates a
world from it and checks the settings that depend on each other (`generate_world`).

Usage::

    cfg = WorldConfig(seed=0, dev_clusters=6, named=0.25)
    cfg = world_config_from(manifest["config"])       # a world artifact's settings
    extra = fresh_world_config(cfg, i=0, clusters=10)  # the i-th fresh world beside it
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from r3rag.util.config import hashed_when_set


@dataclass
class WorldConfig:
    seed: int = 0  # the random seed: the same settings and seed give the same world, word for word
    n_clusters: int = 60  # clusters of people, companies and universities (train + dev + test)
    test_clusters: int = 6  # the last clusters, whose questions form the test split
    people_per_cluster: int = 40  # people in each cluster (no one belongs to two clusters)
    companies_per_cluster: int = 8  # companies in each cluster
    universities_per_cluster: int = 3  # universities in each cluster
    n_cities: int = 120  # cities, shared by all clusters (every split sees them)
    n_countries: int = 30  # countries the cities lie in, shared by all clusters
    # "facts": one sentence per fact, each "<name> <relation phrase> <value> ." (copyable);
    # "prose": one varied sentence per entity stating all its facts (harder to read).
    doc_style: Literal["facts", "prose"] = "facts"
    # "fact": one document per fact (a retrieved fact can be restated by copying it);
    # "entity": one document per entity holding all its facts.
    doc_unit: Literal["fact", "entity"] = "fact"
    # Harder worlds: phrasings per relation in fact documents (1 = the canonical phrase only;
    # queries always use the canonical one), and "all" adds 3- and 4-hop question types.
    paraphrases: int = 1
    question_types: Literal["basic", "all"] = "basic"  # "basic": 7 types of 2-3 hops; "all": 4 more of 3-4
    # The clusters just before the test clusters form the dev split (settings are chosen on it;
    # 0 = no dev split). They come out of train, so train and test chain questions keep their ids.
    dev_clusters: int = 0
    # Share of chain questions that also get a named twin (type "named", one retrieval away).
    named: float = 0.0
    # Long horizons (r3rag.data.world_long): [lo, hi] adds questions that need lo to hi searches
    # each (mentor chains; "founded first" and "how many founded before a year" over a list of
    # companies) and the mentor facts they read; [] (default): none, the world as before.
    long_horizon: list[int] = hashed_when_set(default_factory=list, silent=True)
    long_per_count: int = hashed_when_set(8, silent=True)  # long-horizon questions per type, search count and split


def world_config_from(saved: dict) -> WorldConfig:
    """The WorldConfig inside a saved config (a world artifact's manifest), other keys ignored."""
    return WorldConfig(**{k: saved[k] for k in WorldConfig.__dataclass_fields__ if k in saved})


def fresh_world_config(base: WorldConfig, i: int, clusters: int = 0) -> WorldConfig:
    """The i-th freshly generated world beside `base` (training mixes, base-model text): the same
    settings, a seed disjoint from `base.seed`, and `clusters` clusters all in train (0 = as base).
    A fresh world has no dev split: nothing is tuned on it, so its dev clusters train too."""
    size = {"n_clusters": clusters, "test_clusters": 0} if clusters else {}
    return WorldConfig(**{**base.__dict__, "seed": base.seed * 100_003 + 7_919 * (i + 1), "dev_clusters": 0, **size})
