"""Experiments (`variants` + `table` in a pipeline): shared artifacts, placeholders, the table."""

import json
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.conftest import TINY_WORLD

ROOT = Path(__file__).resolve().parents[1]

TINY_SFT = {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "lr": 1e-2, "bf16": False}
TINY_RL = {
    "steps": 1,
    "prompts_per_step": 2,
    "num_generations": 4,
    "bf16": False,
    "max_turns": 3,
    "max_new_tokens": 16,
    "save_steps": 0,
}


def _experiment(tmp_path, **changes) -> Path:
    data = {
        "name": "mini",
        "stages": ["world", "index", "synthesize", "sft", "rl", "eval"],
        "world": TINY_WORLD,
        "index": {"name": "bm25"},
        "synthesize": {"template": "minimal", "doc_style": "plain"},
        "sft": TINY_SFT,
        "rl": TINY_RL,
        "eval": {"limit": 12, "max_turns": 3, "max_new_tokens": 16},
        "variants": {
            "bm25": {"stages": ["world", "index"]},
            "rank": {"stages": ["world", "index"], "set": ["index.name=rank", "index.backend=rank-bm25"]},
            "main": {"set": ["eval.retrievers=[${bm25.index},${rank.index}]"]},
            "nomask": {"set": ["rl.mask_retrieved=false", "eval.systems=[rl]"]},
        },
        "table": {
            "RAG": "main/rag@bm25",
            "SFT": "main/sft@bm25",
            "SFT + GRPO": "main/rl@bm25",
            "SFT + GRPO, rank-bm25": "main/rl@rank-bm25:rank",
            "no masking": "nomask/rl",
        },
    }
    data.update(changes)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_experiment_shares_artifacts_fills_placeholders_and_writes_the_table(tmp_path):
    from r3rag.experiments.run import run_file

    runs = tmp_path / "runs"
    ref = run_file(_experiment(tmp_path), ["rl.seed=3"], runs)
    # one world, synthesis and SFT for every variant; two indexes; two RL policies (mask on/off)
    counts = {
        s: len([d for d in (runs / s).iterdir() if not d.name.startswith(".")])
        for s in ("world", "index", "synthesize", "sft", "rl", "eval")
    }
    assert counts == {"world": 1, "index": 2, "synthesize": 1, "sft": 1, "rl": 2, "eval": 2}
    table = json.loads((ref.path / "table.json").read_text())
    rows = {r["label"]: r for r in table["rows"]}
    main_eval = json.loads((Path(ref.manifest["inputs"]["main"]["path"]) / "metrics.json").read_text())
    assert rows["SFT + GRPO"]["em"] == main_eval["systems"]["rl@bm25"]["em"]
    assert set(main_eval["systems"]) >= {"rl@bm25", "rl@rank-bm25:rank", "sft@bm25"}
    assert rows["SFT"]["train_seconds"] < rows["SFT + GRPO"]["train_seconds"]  # RL adds its own time
    for path in (runs / "rl").iterdir():
        cfg = yaml.safe_load((path / "config.yaml").read_text())
        assert cfg["seed"] == 3  # the command line's override reached every variant's rl
    md = (ref.path / "table.md").read_text()
    assert md.splitlines()[0].startswith("|  | EM [95% CI]") and "| no masking |" in md and "Wall time" in md
    assert (ref.path / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the EM chart
    again = run_file(_experiment(tmp_path), ["rl.seed=3"], runs)  # everything reused, the same table
    assert again.path == ref.path and (again.path / "table.md").read_text() == md


@pytest.mark.parametrize(
    "change, needles",
    [
        ({"table": {"x": "nope/rl"}}, ["table.x", "'nope/rl'"]),
        ({"table": {"seeds": ["main/rl", "nope/rl"]}}, ["table.seeds", "'nope/rl'"]),  # a row over seeds
        (
            {"variants": {"a": {"stages": ["world"], "set": ["rl.lr=1"]}}, "table": {"x": "a/rl"}},
            ["variants.a.set", "'rl'"],
        ),
        (
            {
                "variants": {
                    "a": {"set": ["eval.retrievers=[${later.index}]"]},
                    "later": {"stages": ["world", "index"]},
                },
                "table": {"x": "a/rl"},
            },
            ["${later.index}", "earlier variant"],
        ),
        ({"variants": {"a": {"sets": []}}, "table": {"x": "a/rl"}}, ["variants.a", "stages"]),
    ],
)
def test_bad_experiments_fail_with_one_line(tmp_path, change, needles):
    path = _experiment(tmp_path, **change)
    out = r3rag_inprocess("run", path, "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, *needles)


def test_replicate_pipeline_dry_run_plans_every_variant(tmp_path):
    out = r3rag_inprocess("run", ROOT / "pipelines" / "replicate.yaml", "--dry-run", "--runs-dir", tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    for seed in (0, 1, 2):  # three seeds of GRPO, its control and the masking ablation, each from its own cold start
        assert f"main#s{seed}: rl" in out.stdout and f"nomask#s{seed}: rl" in out.stdout
    assert "max_steps=100" in out.stdout and "steps=100" in out.stdout
    from r3rag.experiments.run import plan_file

    plan = {row["stage"]: row for row in plan_file(ROOT / "pipelines" / "replicate.yaml", [], tmp_path / "runs")}
    for seed in (0, 1, 2):
        assert f"<main#s{seed}.sft>/model" in str(plan[f"more_sft#s{seed}: sft"])
    assert not (tmp_path / "runs").exists()
    bad = r3rag_inprocess("run", ROOT / "pipelines" / "replicate.yaml", "--dry-run", "--set", "report.x=1")
    assert_one_line_error(bad, "report.x=1", "not a stage")


def test_replicate_ablations_dry_run_keeps_the_replication_settings(tmp_path):
    """replicate-ablations.yaml and replicate-extras.yaml extend replicate.yaml: the same world, seeds,
    cold start and GRPO (so they reuse its artifacts), each ablation at the main run's 100 steps."""
    from r3rag.experiments.pipeline import _load_pipeline

    base = _load_pipeline(ROOT / "pipelines" / "replicate.yaml")
    ablations = _load_pipeline(ROOT / "pipelines" / "replicate-ablations.yaml")
    for section in ("world", "index", "synthesize", "sft", "rl", "eval", "seeds"):
        assert ablations[section] == base[section]
    assert "process" in ablations["variants"] and "nomask" in base["variants"]  # masking: a main arm
    extras = _load_pipeline(ROOT / "pipelines" / "replicate-extras.yaml")  # the arms cut for the budget
    cut = {"rft", "reader_closed", "reader_rag3", "fresh_rag12", "lora_rl", "lora", "scratch", "process_oracle"}
    assert set(extras["variants"]) == cut | {"main", "fresh", "cold"}  # the cold starts they start from
    assert not cut & set(base["variants"]) and extras["seeds"] == base["seeds"]
    assert not any("steps" in s for v in ablations["variants"].values() for s in v.get("set", []))
    assert any("ORACLE" in label for label in extras["table"])  # gold relevance is labelled an oracle
    out = r3rag_inprocess(
        "run", ROOT / "pipelines" / "replicate-ablations.yaml", "--dry-run", "--runs-dir", tmp_path / "runs"
    )
    assert out.returncode == 0, out.stderr
    assert "process#s2: rl" in out.stdout and "steps=100" in out.stdout


def test_train_minutes_follow_a_model_another_variant_trained(tmp_path):
    """`rl.model=${lora.base}/model`: the RL row's training time includes the base LM it started from."""
    from types import SimpleNamespace

    from r3rag.experiments.results.table import train_seconds

    base = tmp_path / "runs" / "base" / "b-1"
    (base / "model").mkdir(parents=True)
    (base / "manifest.json").write_text(
        json.dumps({"stage": "base", "id": "b-1", "content_hash": "x", "seconds": 120.0})
    )
    rl = SimpleNamespace(manifest={"id": "r-1", "seconds": 30.0, "config": {"model": str(base / "model")}})
    assert train_seconds("rl", {"rl": rl}) == 150.0
    rl.manifest["config"]["model"] = "Qwen/Qwen2.5-3B"  # a hub id: nothing to add
    assert train_seconds("rl", {"rl": rl}) == 30.0
    assert (
        train_seconds(
            "rl", {"rl": rl, "base": SimpleNamespace(manifest=json.loads((base / "manifest.json").read_text()))}
        )
        == 150.0
    )


def test_train_minutes_count_samples_drawn_from_a_policy_not_a_teachers():
    """Rejection sampling's samples (synthesize.teacher=hf) are part of that control's training."""
    from types import SimpleNamespace

    from r3rag.experiments.results.table import train_seconds

    sft = SimpleNamespace(manifest={"id": "s-1", "seconds": 800.0, "config": {"model": "tiny"}})

    def sampled(teacher):  # published before its seconds covered the sampling: wall_seconds holds it
        m = {"id": "y-1", "seconds": 1.3, "metrics": {"wall_seconds": 1300.0}, "config": {"teacher": teacher}}
        return SimpleNamespace(manifest=m)

    assert train_seconds("sft", {"synthesize": sampled("hf"), "sft": sft}) == 2100.0
    assert train_seconds("sft", {"synthesize": sampled("oracle"), "sft": sft}) == 800.0


def test_a_seeded_experiment_trains_each_seed_and_reports_mean_and_sd(tmp_path):
    """`seeds:` runs the cold start once per seed (its world, index and teacher data shared) and
    the table row is over seeds."""
    from r3rag.experiments.run import run_file

    runs = tmp_path / "runs"
    path = _experiment(
        tmp_path,
        seeds={"values": [0, 1], "set": ["sft.seed={seed}"]},
        variants={
            "cold": {
                "stages": ["world", "index", "synthesize", "sft", "eval"],
                "set": ["eval.rl=", "eval.systems=[sft]"],
            }
        },
        table={"SFT": "cold/sft", "SFT, again": "cold/sft"},
        compare=[["SFT, again", "SFT"]],  # paired over the same questions: nothing between an arm and itself
    )
    ref = run_file(path, [], runs)
    seeds = sorted(yaml.safe_load((d / "config.yaml").read_text())["seed"] for d in (runs / "sft").iterdir())
    assert seeds == [0, 1] and len(list((runs / "synthesize").iterdir())) == 1
    row = json.loads((ref.path / "table.json").read_text())["rows"][0]
    per_seed = [
        json.loads((Path(ref.manifest["inputs"][f"cold#s{s}"]["path"]) / "metrics.json").read_text())["systems"]["sft"][
            "em"
        ]
        for s in (0, 1)
    ]
    assert row["n_seeds"] == 2 and row["em_per_seed"] == per_seed
    (same,) = json.loads((ref.path / "table.json").read_text())["comparisons"]
    assert same["diff"] == 0 and same["inside_noise"] and same["n_seeds"] == [2, 2]
    assert "| SFT, again | SFT | +0.000 [" in (ref.path / "table.md").read_text()
    status = r3rag_inprocess("run", path, "--status", "--runs-dir", runs)  # every seed done: the same rows
    assert status.returncode == 0 and "Results so far" in status.stdout
    assert f"| SFT | {row['em']:.3f} ± {row['em_sd']:.3f} [" in status.stdout and "of 2 seeds" not in status.stdout


def test_an_rl_run_resumed_before_its_legs_were_timed_adds_an_estimate_of_them(tmp_path):
    """An RL artifact resumed before r3rag recorded `train_seconds_before_resume` counted its last
    leg only: its row adds the median logged step time x the steps before the resume."""
    from types import SimpleNamespace

    from r3rag.experiments.results.table import train_seconds

    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "time/step": t}) + "\n" for s, t in [(2, 3.0), (4, 900.0), (6, 5.0), (8, 4.0)])
    )
    metrics = {"resumed_from_step": 6}
    rl = SimpleNamespace(manifest={"stage": "rl", "id": "r", "seconds": 10.0, "metrics": metrics}, path=tmp_path)
    assert train_seconds("rl", {"rl": rl}) == 10.0 + 5.0 * 6  # median of the times up to step 6
    metrics["train_seconds_before_resume"] = 40.0  # timed: `seconds` already holds every leg
    assert train_seconds("rl", {"rl": rl}) == 10.0
