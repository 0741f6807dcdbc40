"""The replication's pipelines (issue 17): settings chosen on dev, the test split and a fresh
world seed scored in replicate.yaml, and reader baselines on the cold start's budget."""

from pathlib import Path

import pytest

from r3rag.experiments.pipeline import _load_pipeline
from tests.cli_helpers import r3rag_inprocess

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"


def _sets(variant: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in variant.get("set", []))


def test_replicate_scores_test_once_with_a_dev_split_and_named_questions():
    p = _load_pipeline(PIPELINES / "replicate.yaml")
    assert p["world"]["dev_clusters"] > 0 and 0 < p["world"]["named"] < 1
    assert p["eval"]["split"] == "test"
    assert all(_sets(v).get("eval.split", "dev") == "dev" for v in p["variants"].values())  # only dev is opted into


def test_the_fresh_seed_was_never_used_and_runs_last():
    p = _load_pipeline(PIPELINES / "replicate.yaml")
    names = list(p["variants"])
    fresh = [n for n in names if "world.seed" in _sets(p["variants"][n])]
    assert fresh and names[-len(fresh) :] == fresh  # read once, after everything tuned on dev
    seeds = {_sets(p["variants"][n])["world.seed"] for n in fresh}
    used = {str(_load_pipeline(PIPELINES / f)["world"].get("seed", 0)) for f in ("demo.yaml", "replicate.yaml")}
    assert len(seeds) == 1 and not seeds & used
    assert any(label.startswith("World seed 2, never tuned on") for label in p["table"])


def test_readers_train_on_the_cold_starts_questions_and_budget():
    """A reader variant changes only what makes it a reader: the teacher data's framing (reader,
    template, top_k), its start (the same seed's and world's cold-start policy) and what eval runs;
    the questions, trajectory count, epochs and lr are the cold start's."""
    p = _load_pipeline(PIPELINES / "replicate.yaml")
    extras = _load_pipeline(PIPELINES / "replicate-extras.yaml")  # the readers cut for the budget
    variants = {**p["variants"], **extras["variants"]}
    readers = {n: v for n, v in variants.items() if "synthesize.reader" in _sets(v)}
    assert {_sets(v)["synthesize.reader"] for v in readers.values()} == {"closed-book", "rag", "gold"}
    for name, v in readers.items():
        keys = set(_sets(v)) - {"world.seed"}
        assert keys <= {
            "synthesize.reader",
            "synthesize.template",
            "synthesize.top_k",
            "sft.model",
            "eval.systems",
            "eval.top_k",
            "eval.rl",
        }, name
        assert _sets(v)["synthesize.template"] == "qa"
        cold_start = "fresh" if "world.seed" in _sets(v) else "main"  # world seed 2's own cold start
        assert _sets(v)["sft.model"] == f"${{{cold_start}.sft}}/model", name
        if _sets(v)["synthesize.reader"] == "rag":  # trained at the depth it is evaluated at
            assert _sets(v)["synthesize.top_k"] == _sets(v)["eval.top_k"]
    depths = {int(_sets(v)["eval.top_k"]) for v in readers.values() if "eval.top_k" in _sets(v)}
    max_hops, per_search = 4, p["synthesize"]["top_k"]
    assert depths == {per_search, max_hops * per_search}  # top-3, and every document a 4-hop chain sees


@pytest.mark.parametrize("name", ["replicate-dev.yaml", "replicate-ppo-dev.yaml"])
def test_replicate_dev_tunes_on_dev_only_and_plans(tmp_path, name):
    dev = _load_pipeline(PIPELINES / name)
    base = _load_pipeline(PIPELINES / "replicate.yaml")
    assert dev["eval"]["split"] == "dev" and dev["world"] == base["world"]
    for v in dev["variants"].values():
        assert not {"eval.split", "world.seed"} & set(_sets(v))
    out = r3rag_inprocess("run", PIPELINES / name, "--dry-run", "--runs-dir", tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    assert "split=dev" in out.stdout and "split=test" not in out.stdout
    assert not (tmp_path / "runs").exists()


def test_the_real_model_table_has_seeds_a_dev_split_and_a_trained_reader(tmp_path):
    """real-smollm2-seeds.yaml: the real pipeline with three seeds, a dev split cut from the test
    file's next questions, a trained RAG reader beside the prompted baselines; its dev file
    chooses GRPO's lr on dev only. Both plan without data or weights."""
    seeds = _load_pipeline(PIPELINES / "real-smollm2-seeds.yaml")
    assert seeds["seeds"]["values"] == [0, 1, 2] and seeds["eval"]["split"] == "test"
    assert seeds["world"]["dev"] == seeds["world"]["test"][:1] and seeds["world"]["limits"]["dev"] > 60
    assert _sets(seeds["variants"]["reader_rag5"])["synthesize.reader"] == "rag"
    dev = _load_pipeline(PIPELINES / "real-smollm2-dev.yaml")
    assert dev["eval"]["split"] == "dev" and dev["seeds"] is None
    for name in ("real-smollm2-seeds.yaml", "real-smollm2-dev.yaml"):
        out = r3rag_inprocess("run", PIPELINES / name, "--dry-run", "--runs-dir", tmp_path / "runs")
        assert out.returncode == 0, out.stderr


def test_the_real_rl_pilot_scores_dev_only_and_each_slice_fits(tmp_path):
    """real-smollm2-rl.yaml (issue 47): the pool split fixes test before anything is tuned, no
    slice scores test, each fits a slice's budget; it plans without data or weights."""
    from r3rag.experiments.slices.cut import MAX_MINUTES

    p = _load_pipeline(PIPELINES / "real-smollm2-rl.yaml")
    assert p["world"]["pool_split"] == {"test": 300, "dev": 80} and not p["world"]["test"]
    assert p["eval"]["split"] == "dev" and all("eval.split" not in _sets(v) for v in p["variants"].values())
    assert {float(_sets(v).get("rl.lr", p["rl"]["lr"])) for k, v in p["variants"].items() if k != "cold"} == {
        3e-6,
        1e-5,
        3e-5,
    }
    assert all(s["minutes"] <= MAX_MINUTES for s in p["slices"].values())
    # the long run's links: each from the one before (the first from a learning rate's run), a seed of its own
    links = [k for k in p["variants"] if k.startswith("g")]
    starts = [_sets(p["variants"][k])["rl.policy"] for k in links]
    assert starts[1:] == [f"${{{k}.rl}}" for k in links[:-1]] and starts[0].startswith("${lr_")
    assert len({_sets(p["variants"][k])["rl.seed"] for k in links}) == len(links) == 5
    start = _sets(p["variants"][starts[0][2:-4]])  # ${lr_3e-5.rl} -> lr_3e-5: every link trains at its rate
    assert {_sets(p["variants"][k])["rl.lr"] for k in links} == {start["rl.lr"]}
    out = r3rag_inprocess("run", PIPELINES / "real-smollm2-rl.yaml", "--dry-run", "--runs-dir", tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    assert "split=dev" in out.stdout and "split=test" not in out.stdout


def test_the_long_horizon_experiment_compares_one_thing_and_plans(tmp_path):
    """long-horizon.yaml: its arms differ only in what the loop shows the model (every stage that
    rolls out, and the SFT rows that follow from it), share one context budget within the tiny
    model's positions, read only the long questions; its pilot scores on dev. Both plan."""
    from r3rag.data.world_long import TYPES

    p = _load_pipeline(PIPELINES / "long-horizon.yaml")
    budget = {p[s]["max_context_tokens"] for s in ("rl", "eval")}  # synthesize's oracle has no tokenizer
    assert budget == {p["sft"]["max_length"]}  # the model's positions: keep_all runs out of them, fold need not
    assert all(p[s]["types"] == list(TYPES) for s in ("synthesize", "rl", "eval")) and p["eval"]["split"] == "test"
    fold, keep_all = _sets(p["variants"]["fold"]), _sets(p["variants"]["keep_all"])
    assert {k: v for k, v in fold.items() if k != "eval.systems"} == {
        **{f"{s}.context": "fold" for s in ("synthesize", "sft", "rl", "eval")},
        "sft.view": "step",
    }
    assert set(keep_all) == {"eval.systems"}
    pilot = _load_pipeline(PIPELINES / "long-horizon-pilot.yaml")
    assert pilot["eval"]["split"] == "dev" and pilot["seeds"] is None
    for name in ("long-horizon.yaml", "long-horizon-pilot.yaml"):
        out = r3rag_inprocess("run", PIPELINES / name, "--dry-run", "--runs-dir", tmp_path / "runs")
        assert out.returncode == 0, out.stderr
    assert "split=dev" in out.stdout and "split=test" not in out.stdout  # the pilot never reads test
