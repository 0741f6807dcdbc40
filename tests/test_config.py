"""Typed configs: YAML + --set overrides, unknown keys and wrong types are clear errors."""

import pytest

from r3rag.stages import rl, sft
from r3rag.util.config import build_config, load_yaml, parse_overrides
from r3rag.util.errors import UserError


def test_overrides_are_parsed_as_yaml():
    cfg = build_config(sft.Config, {"epochs": 2}, parse_overrides(["lr=1e-4", "lora=true", "lora_settings.r=8"]))
    assert (cfg.epochs, cfg.lr, cfg.lora, cfg.lora_settings.r) == (2.0, 1e-4, True, 8)
    r = build_config(rl.Config, {}, parse_overrides(["rewards={em: 1.0, format: 0.2}"]))
    assert r.rewards == {"em": 1.0, "format": 0.2}


def test_unknown_key_and_wrong_type_name_the_place():
    with pytest.raises(UserError, match=r"demo.yaml: sft: unknown key 'epoch'"):
        build_config(sft.Config, {"epoch": 2}, where="demo.yaml: sft")
    with pytest.raises(UserError, match=r"sft.batch_size: expected an integer"):
        build_config(sft.Config, {"batch_size": "big"}, where="sft")
    with pytest.raises(UserError, match="expected key=value"):
        parse_overrides(["novalue"])


def test_yaml_errors_have_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("sft:\n  epochs: [1,\n")
    with pytest.raises(UserError, match=r"bad.yaml: line \d+ invalid YAML"):
        load_yaml(p)
    with pytest.raises(UserError, match="config file not found"):
        load_yaml(tmp_path / "missing.yaml")


def test_pipeline_overrides_must_name_a_stage(tmp_path):
    from r3rag.experiments.pipeline import run_pipeline

    p = tmp_path / "p.yaml"
    p.write_text("name: x\nworld:\n  seed: 1\n")
    with pytest.raises(UserError, match="name the stage"):
        run_pipeline(p, ["seed=3"], tmp_path)
    with pytest.raises(UserError, match="'sft' is not a stage of this pipeline"):
        run_pipeline(p, ["sft.lr=1"], tmp_path)
    ref = run_pipeline(p, ["world.n_clusters=3", "world.test_clusters=1"], tmp_path / "runs")
    assert ref.manifest["config"]["n_clusters"] == 3 and ref.manifest["config"]["seed"] == 1


def test_a_pipeline_extends_another_and_changes_some_settings(tmp_path):
    from r3rag.experiments.pipeline import _load_pipeline, plan_pipeline

    (tmp_path / "base.yaml").write_text(
        "name: b\nstages: [world, index]\nworld: {seed: 1, n_clusters: 4}\nindex: {name: bm25}\n"
    )
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "child.yaml"
    child.write_text("extends: ../base.yaml\nworld: {seed: 2}\n")
    data = _load_pipeline(child)
    assert data["world"] == {"seed": 2, "n_clusters": 4}  # a section's keys replace the base's keys
    assert data["index"] == {"name": "bm25"} and data["stages"] == ["world", "index"] and data["name"] == "b"
    plan = plan_pipeline(child, [], tmp_path / "runs")
    assert [row["stage"] for row in plan] == ["world", "index"]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("extends: nowhere.yaml\n", "extends: no pipeline file"),
        ("extends: p.yaml\n", "extends itself"),
    ],
)
def test_bad_extends_fail_with_one_line(tmp_path, text, needle):
    from r3rag.experiments.pipeline import _load_pipeline

    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(UserError, match=needle):
        _load_pipeline(p)
