"""The stage registry (r3rag.stages): every stage module is in it, each resolves to a module with the
stage interface, the CLI has a command per stage, and an unknown name is one clear error."""

from pathlib import Path

import pytest

import r3rag.stages
from r3rag.core.artifacts import FILE
from r3rag.stages import STAGE_ORDER, STAGES, stage_module
from r3rag.util.errors import UserError

STAGES_DIR = Path(r3rag.stages.__file__).parent
NOT_STAGES = {"__init__", "common"}  # the registry itself and what every stage shares


def test_every_stage_module_is_registered():
    modules = {p.stem for p in STAGES_DIR.glob("*.py")} - NOT_STAGES
    assert modules == set(STAGES)
    assert set(STAGE_ORDER) < set(STAGES)


@pytest.mark.parametrize("name", STAGES)
def test_a_name_resolves_to_its_stage_module(name):
    module = stage_module(name)
    assert module.__name__ == f"r3rag.stages.{name}"
    assert callable(module.run) and isinstance(module.INPUTS, dict)
    module.Config()  # every setting has a default: the CLI's help lists them
    assert module.__doc__.split("\n\n")[0] == STAGES[name]  # the summary `r3rag --help` shows
    assert all(src in (*STAGES, FILE) for src in module.INPUTS.values()), module.INPUTS


def test_an_unknown_stage_is_one_line_naming_the_known_ones():
    with pytest.raises(UserError) as e:
        stage_module("sfx")
    assert str(e.value) == f"unknown stage 'sfx' (known: {', '.join(STAGES)})"


def test_the_cli_has_a_command_per_stage():
    from r3rag.cli.app import app

    assert set(STAGES) <= {c.name for c in app.registered_commands}
