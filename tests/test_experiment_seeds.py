"""Seeds in an experiment (r3rag.experiments.seeds): each seeded variant runs once per seed, its
references stay within the seed, table rows become seed rows, and bad `seeds` sections are one
clear error."""

from pathlib import Path

import pytest

from r3rag.experiments.experiment import parse_variants
from r3rag.experiments.seeds import expand_seeds
from r3rag.util.errors import UserError

PATH = Path("exp.yaml")


def experiment(**extra) -> dict:
    return {
        "stages": ["world", "index", "synthesize", "sft", "rl", "eval"],
        "seeds": {"values": [0, 1], "set": ["sft.seed={seed}", "rl.seed={seed}"]},
        "variants": {
            "bm25": {"stages": ["world", "index"]},
            "main": {"set": ["eval.retrievers=[${bm25.index}]"]},
            "more_sft": {"stages": ["world", "index", "synthesize", "sft", "eval"], "set": ["sft.model=${main.sft}"]},
        },
        "table": {"cold start": "main/sft", "control": "more_sft/sft", "two": ["main/rl", "more_sft/sft"]},
        **extra,
    }


def test_seeded_variants_run_once_per_seed_seed_by_seed_and_unseeded_ones_once():
    out = expand_seeds(PATH, experiment())
    assert list(out["variants"]) == ["bm25", "main#s0", "more_sft#s0", "main#s1", "more_sft#s1"]
    assert out["variants"]["main#s1"]["set"] == ["eval.retrievers=[${bm25.index}]", "sft.seed=1", "rl.seed=1"]
    # the control of seed 1 starts from seed 1's cold start; it runs no rl, so gets no rl.seed
    assert out["variants"]["more_sft#s1"]["set"] == ["sft.model=${main#s1.sft}", "sft.seed=1"]
    assert "seeds" not in out
    parse_variants(PATH, out)  # what the experiment then checks: every row names a variant that runs eval


def test_table_rows_become_one_source_per_seed():
    table = expand_seeds(PATH, experiment())["table"]
    assert table["cold start"] == ["main#s0/sft", "main#s1/sft"]
    assert table["two"] == ["main#s0/rl", "main#s1/rl", "more_sft#s0/sft", "more_sft#s1/sft"]


def test_without_seeds_or_with_seeds_null_nothing_changes():
    plain = experiment()
    del plain["seeds"]
    assert expand_seeds(PATH, plain) == plain
    assert expand_seeds(PATH, experiment(seeds=None)) == plain


@pytest.mark.parametrize(
    "seeds, message",
    [
        ([0, 1], "expected a mapping with `values`"),
        ({"values": []}, "non-empty list of ints"),
        ({"values": [0, 0]}, "repeats a seed"),
        ({"values": [0], "set": ["sft.seed=3"]}, "{seed}"),
        ({"values": [0], "sets": []}, "expected a mapping"),
    ],
)
def test_a_bad_seeds_section_is_one_clear_error(seeds, message):
    with pytest.raises(UserError, match="exp.yaml: seeds") as err:
        expand_seeds(PATH, experiment(seeds=seeds))
    assert message in str(err.value)


def test_an_unseeded_variant_cannot_name_a_seeded_one():
    data = experiment()
    data["variants"]["bm25"]["set"] = ["index.name=${main.sft}"]  # which seed's?
    with pytest.raises(UserError, match="names seeded variant 'main'"):
        expand_seeds(PATH, data)
