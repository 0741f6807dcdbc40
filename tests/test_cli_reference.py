"""The generated reference pages match the code: docs/cli.md (the Typer app) names every command,
docs/settings.md (each stage's Config) every setting."""

import dataclasses
import importlib.util
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_are_up_to_date():
    for path, page in _generator().pages().items():
        assert path.read_text() == page, f"{path.name} is out of date: run python docs/gen_cli_reference.py"


def test_cli_reference_has_a_section_per_command():
    from r3rag.cli.app import app

    group = typer.main.get_command(app)
    names = group.list_commands(typer.Context(group, info_name="r3rag"))
    assert {"run", "world", "sft", "rl", "eval", "report"} <= set(names)
    page = (ROOT / "docs" / "cli.md").read_text()
    for name in names:
        assert f"## `r3rag {name}`" in page, name


def test_settings_reference_lists_every_setting_with_its_comment():
    from r3rag.stages import STAGES, stage_module

    page = (ROOT / "docs" / "settings.md").read_text()
    for stage in STAGES:
        assert f"## `{stage}`" in page
        for f in dataclasses.fields(stage_module(stage).Config):
            assert f"| `{f.name}` |" in page, (stage, f.name)
    # the comment beside a field in the code, nested settings flattened, unhashed ones marked
    assert "| `top_k` | `3` | documents per search |" in page
    assert "| `lora_settings.r` |" in page and "*(not hashed)*" in page
