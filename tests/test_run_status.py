"""`r3rag run FILE --status`: which stages of a pipeline or experiment are done, in progress, to
do or waiting, found by the ids a run would compute, without building anything."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from r3rag.stages.common import NotBuilt
from tests.cli_helpers import r3rag_inprocess
from tests.conftest import TINY_WORLD


def _status(path, runs) -> dict[str, str]:
    from r3rag.experiments.status.stages import status_file

    return {r["stage"]: r["state"] for r in status_file(path, [], runs)}


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_status_finds_built_stages_and_builds_nothing(tmp_path):
    runs = tmp_path / "runs"
    base = {"name": "st", "world": TINY_WORLD, "synthesize": {"template": "minimal", "doc_style": "plain"}}
    three = _write(tmp_path / "three.yaml", {**base, "stages": ["world", "index", "synthesize"]})
    assert _status(three, runs) == {"world": "to do", "index": "waiting", "synthesize": "waiting"}
    assert not runs.exists() or not any(p.is_file() for p in runs.rglob("*"))  # nothing written
    two = _write(tmp_path / "two.yaml", {**base, "stages": ["world", "index"]})
    assert r3rag_inprocess("run", two, "--runs-dir", runs).returncode == 0
    assert _status(three, runs) == {"world": "done", "index": "done", "synthesize": "to do"}
    changed = _write(tmp_path / "changed.yaml", {**base, "world": {**TINY_WORLD, "seed": 99}, "stages": ["world"]})
    assert _status(changed, runs) == {"world": "to do"}  # other settings: another artifact
    out = r3rag_inprocess("run", three, "--status", "--runs-dir", runs)
    assert out.returncode == 0 and "2 done, 0 in progress, 1 to do, 0 waiting (of 3 stages)" in out.stdout
    assert (
        "no estimate of the time left yet" in out.stdout and "h of build time left" not in out.stdout
    )  # nothing to go by


def test_an_experiment_variant_waits_for_the_variant_it_names(tmp_path):
    runs = tmp_path / "runs"
    data = {
        "name": "st",
        "world": TINY_WORLD,
        "stages": ["world", "index"],
        "variants": {
            "a": {"stages": ["world"]},
            "b": {"stages": ["world", "index", "eval"], "set": ["index.world=${a.world}"]},
        },
        "table": {"row": "b/rag"},
    }
    path = _write(tmp_path / "exp.yaml", data)
    want = {"a: world": "to do", "b: world": "waiting", "b: index": "waiting", "b: eval": "waiting"}
    assert _status(path, runs) == want


@pytest.mark.parametrize("stage", ["rl", "sft"])
def test_a_run_with_checkpoints_is_in_progress(tmp_path, stage):
    from r3rag.experiments.status.stages import _unbuilt

    final = tmp_path / stage / "x-abc"
    missing = NotBuilt(stage, "x-abc", final, SimpleNamespace())
    assert _unbuilt(missing) == {"state": "to do", "detail": "x-abc"}
    for step in (40, 120, 130):
        ckpt = tmp_path / stage / ".work-x-abc" / "checkpoints" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        if step != 130:  # 130: killed while saving, no trainer_state.json: a resume skips it
            (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 200}))
    assert _unbuilt(missing) == {"state": "in progress", "detail": "checkpoint at step 120 of 200", "done_share": 0.6}


def test_a_synthesize_or_eval_with_a_journal_is_in_progress(tmp_path):
    from r3rag.experiments.status.stages import _unbuilt

    missing = NotBuilt("eval", "e-abc", tmp_path / "eval" / "e-abc", SimpleNamespace())
    journal = tmp_path / "eval" / ".journal-e-abc.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text("")  # opened, nothing finished yet
    assert _unbuilt(missing) == {"state": "to do", "detail": "e-abc"}
    journal.write_text('{"id": "sft|0|0:64"}\n{"id": "sft|0|64:128"}\n')
    assert _unbuilt(missing) == {"state": "in progress", "detail": "journal of 2 finished items (e-abc)"}


def test_time_left_counts_each_left_stage_by_the_same_stage_at_another_seed():
    """main#s1 takes what main#s0 took; a checkpointed run the part left; dev's sft is main's
    artifact at seed 0, so dev#s1's is main#s1's and counts nothing; no sibling, no figure."""
    from r3rag.experiments.status.stages import time_left

    def row(stage, state, detail="", **extra):
        return {"stage": stage, "state": state, "detail": detail, **extra}

    rows = [
        row("main#s0: sft", "done", "sft-a", seconds=1000.0),
        row("main#s0: rl", "done", "rl-a", seconds=3000.0),
        row("dev#s0: sft", "done", "sft-a", seconds=1000.0),
        row("dev#s0: eval", "done", "eval-d", seconds=60.0),
        row("fresh#s0: world", "to do", "world-f"),
        row("main#s1: sft", "done", "sft-b", seconds=1100.0),
        row("main#s1: rl", "in progress", "checkpoint at step 150 of 200", done_share=0.75),
        row("dev#s1: sft", "done", "sft-b", seconds=1100.0),
        row("dev#s1: eval", "waiting"),
        row("main#s2: sft", "to do", "sft-c"),
        row("main#s2: rl", "waiting"),
        row("dev#s2: sft", "waiting"),
        row("dev#s2: eval", "waiting"),
    ]
    seconds, rough, unknown = time_left(rows)
    # main#s1 rl: 3000 x 0.25; main#s2 sft: median(1000, 1100) = 1050; main#s2 rl: 3000;
    # dev#s1 eval and dev#s2 eval: 60 each; dev#s2 sft: main#s2's artifact; fresh#s0 world: no
    # world has run anywhere: no figure
    assert seconds == pytest.approx(750 + 1050 + 3000 + 60 + 60)
    assert (rough, unknown) == (0, 1)
    rows.append(row("fresh#s0: sft", "waiting"))  # fresh has run nothing: every variant's sft, roughly
    seconds, rough, unknown = time_left(rows)
    assert seconds == pytest.approx(750 + 1050 + 3000 + 60 + 60 + 1050) and (rough, unknown) == (1, 1)


def test_a_stage_is_timed_by_its_own_wall_seconds_where_its_manifest_timed_only_publishing():
    from r3rag.core.artifacts import built_seconds

    assert built_seconds({"seconds": 1.3, "metrics": {"wall_seconds": 1305.7}}) == 1305.7
    assert built_seconds({"seconds": 840.0, "metrics": {"steps": 200}}) == 840.0
    assert built_seconds({}) is None


def _eval_ref(folder: Path, system: str, ems: list[float]) -> SimpleNamespace:
    """An eval artifact of one system: metrics.json and per-question predictions.jsonl."""
    folder.mkdir(parents=True)
    em = sum(ems) / len(ems)
    metrics = {"em": em, "em_ci": [0.0, 1.0], "f1": em, "n": len(ems), "searches": 1.0, "by_hops": {}}
    (folder / "metrics.json").write_text(json.dumps({"systems": {system: metrics}}))
    rows = [{"system": system, "id": f"q{i}", "em": e} for i, e in enumerate(ems)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return SimpleNamespace(path=folder, manifest={"id": folder.name, "seconds": 60.0})


def test_results_so_far_are_over_the_finished_seeds_and_say_how_many(tmp_path):
    """--status on a seeded experiment: each row over the seeds whose eval exists, its
    comparisons paired over the same questions; rows with no finished seed are named, not shown."""
    from r3rag.experiments.status.so_far import so_far_markdown

    experiment = {
        "table": {
            "SFT": ["main#s0/sft", "main#s1/sft", "main#s2/sft"],
            "GRPO": ["main#s0/rl", "main#s1/rl", "main#s2/rl"],
            "Reader": ["reader#s0/rag", "reader#s1/rag", "reader#s2/rag"],
        },
        "compare": [["GRPO", "SFT"], ["GRPO", "Reader"]],
    }
    built = {"main#s0": {}, "main#s1": {}, "reader#s0": {"sft": SimpleNamespace(manifest={"id": "s"})}}
    assert so_far_markdown(tmp_path, experiment, built) == ""  # no eval yet: nothing to show
    for seed, sft, rl in [(0, [1, 0, 0, 0], [1, 1, 0, 0]), (1, [1, 1, 0, 0], [1, 1, 1, 1])]:
        main = _eval_ref(tmp_path / f"main{seed}", "sft", sft)
        predictions = main.path / "predictions.jsonl"  # the same eval scores both systems
        predictions.write_text(
            predictions.read_text()
            + "".join(json.dumps({"system": "rl", "id": f"q{i}", "em": e}) + "\n" for i, e in enumerate(rl))
        )
        metrics = json.loads((main.path / "metrics.json").read_text())
        metrics["systems"]["rl"] = {**metrics["systems"]["sft"], "em": sum(rl) / 4, "f1": sum(rl) / 4}
        (main.path / "metrics.json").write_text(json.dumps(metrics))
        built[f"main#s{seed}"] = {"eval": main}
    text = so_far_markdown(tmp_path, experiment, built)
    assert "| SFT (2 of 3 seeds) | 0.375 ± 0.177 [" in text  # seeds 0.25 and 0.5
    assert "| GRPO (2 of 3 seeds) | 0.750 ± 0.354 [" in text
    assert "No seed finished yet: Reader." in text
    assert "| GRPO | SFT | +0.375 [" in text and "| 4 | 2/2 |" in text  # paired, per-question seed means
    assert "GRPO | Reader" not in text  # one arm has no finished seed: no comparison yet
    assert "2026" not in text and "Wall time" not in text  # no single run's date or wall time
