"""Bad settings and pipeline files: an unknown key, a wrong type, a value outside its choices, a
bad artifact name, a broken or misspelled pipeline file. Each is one line `error: ...` naming the
file (and line) and the key, with nothing left in the runs dir (tests/bad_input_helpers.check);
tests/test_bad_input.py feeds the commands broken input files and artifacts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.bad_input_helpers import BIG, base, check, env  # noqa: F401 (fixtures)
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess

# ------------------------------------------------------------------ configs and pipelines

STAGES = ["world", "index", "synthesize", "sft", "rl", "eval"]
KEY_OF = {"world": "seed", "index": "k1", "synthesize": "limit", "sft": "epochs", "rl": "steps", "eval": "limit"}


@pytest.mark.parametrize("stage", STAGES)
def test_unknown_config_key(env, stage):
    args = [stage, "--runs-dir", env.runs]
    p = env.file("p.yaml", f"{stage}:\n  colour: red\n")
    check(env, [*args, "--config", p], "p.yaml", f"{stage}: unknown key 'colour'")
    check(env, [*args, "--set", "colour=red"], "unknown key 'colour'")


@pytest.mark.parametrize("stage", STAGES)
def test_wrong_config_type(env, stage):
    key = KEY_OF[stage]
    p = env.file("p.yaml", f"{stage}:\n  {key}: [1, 2]\n")
    check(env, [stage, "--runs-dir", env.runs, "--config", p], "p.yaml", f"{stage}.{key}", "expected")
    check(env, [stage, "--runs-dir", env.runs, "--set", f"{key}=lots"], f"{key}", "expected")


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "x" * 300, ".hidden"])
def test_bad_artifact_name(env, name):
    check(env, ["world", "--runs-dir", env.runs, "--set", f"name={name}"], "name", "must be")


PIPELINE_CASES = [
    ("missing-file", None, ["not found"]),
    ("empty-file", "", ["no stages"]),
    ("malformed-yaml", "name: x\nworld:\n  seed: [1\n", ["line", "invalid YAML"]),
    ("not-a-mapping", "- world\n- index\n", ["expected a mapping"]),
    ("unknown-top-key", "name: x\ncolour: red\n", ["unknown top-level key 'colour'"]),
    ("unknown-stage-key", "name: x\nworld:\n  colour: red\n", ["world: unknown key 'colour'"]),
    ("wrong-type", "name: x\nworld:\n  seed: abc\n", ["world.seed", "expected an integer"]),
    ("section-not-mapping", "name: x\nworld: 3\n", ["'world' must be a mapping"]),
    ("unknown-stage", "name: x\nstages: [world, train]\nworld: {}\n", ["unknown stage 'train'"]),
    ("non-utf8", b"name: caf\xe9\nworld: {}\n", ["UTF-8"]),
    ("10mb-line", b"name: [" + b"a," * (BIG // 2), ["too large"]),
]


@pytest.mark.parametrize("name, content, needles", PIPELINE_CASES, ids=[c[0] for c in PIPELINE_CASES])
def test_bad_pipeline_file(env, name, content, needles):
    p = env.file(f"pipe-{name}.yaml", content)
    check(env, ["run", p, "--runs-dir", env.runs], p.name, *needles)
    if name not in ("empty-file", "unknown-stage", "not-a-mapping", "unknown-top-key"):  # same loader for --config
        check(env, ["world", "--config", p, "--runs-dir", env.runs], p.name, *needles)


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args, needles",
    [
        (["synthesize", "--set", "template=serch-r1"], ["synthesize.template", "'serch-r1'", "search-r1, minimal, qa"]),
        (["synthesize", "--set", "doc_style=html"], ["synthesize.doc_style", "'html'", "search-r1, plain"]),
        (["synthesize", "--set", "protocol=r4"], ["synthesize.protocol", "'r4'", "search-r1, r3rag, ircot"]),
        (
            ["rl", "--set", "template=serch-r1", "--set", "model=tiny", "--set", "policy="],
            ["rl.template", "'serch-r1'"],
        ),
        # Literal-typed fields, checked by the config itself: a stage's and a nested spec's
        (["index", "--set", "backend=dense", "--set", "pooling=max"], ["index.pooling", "'max'", "mean, cls"]),
        (
            [
                "eval",
                "--set",
                "systems=[m]",
                "--set",
                "models.m.scripted=top-title",
                "--set",
                "models.m.template=serch",
                "--set",
                "sft=",
                "--set",
                "rl=",
            ],
            ["eval.models.m.template", "'serch'", "search-r1, minimal, qa"],
        ),
    ],
    ids=[
        "synthesize-template",
        "synthesize-doc_style",
        "synthesize-protocol",
        "rl-template",
        "index-pooling",
        "eval-spec-template",
    ],
)
def test_setting_outside_its_choices(env, args, needles):
    """A misspelled choice used to be accepted: `synthesize --set template=serch-r1` committed an artifact."""
    check(env, [args[0], "--runs-dir", env.runs, *args[1:]], *needles, "allowed:")


def test_setting_outside_its_choices_dry_run(env):
    out = r3rag_inprocess(
        "run",
        REPO / "pipelines/demo.yaml",
        "--set",
        "synthesize.template=serch-r1",
        "--dry-run",
        "--runs-dir",
        env.runs,
    )
    assert_one_line_error(out, "demo.yaml", "synthesize.template", "'serch-r1'", "allowed: search-r1, minimal, qa")


def test_protocol_checks_every_choice():
    import dataclasses
    import typing

    from r3rag.core.protocol import CHOICES, Protocol
    from r3rag.util.errors import UserError

    hints = typing.get_type_hints(Protocol)
    literals = {
        f.name: typing.get_args(hints[f.name])
        for f in dataclasses.fields(Protocol)
        if typing.get_origin(hints[f.name]) is typing.Literal
    }
    assert CHOICES == literals  # every Literal field is validated, against its own values
    for key in CHOICES:
        with pytest.raises(UserError, match=rf"^protocol\.{key}: unknown .*'nope' \(allowed: "):
            Protocol(**{key: "nope"})


@dataclass
class _Numbered:
    n: Literal[1, 2] = 1


def test_literal_choice_needs_its_type():
    """YAML's `true` is not the choice 1 (True == 1 in Python)."""
    from r3rag.util.config import build_config
    from r3rag.util.errors import UserError

    assert build_config(_Numbered, {"n": 2}).n == 2
    with pytest.raises(UserError, match=r"config\.n: unknown value True \(allowed: 1, 2\)"):
        build_config(_Numbered, {"n": True})


# ------------------------------------------------------------------ pipeline files: top-level keys


@pytest.mark.parametrize(
    "content, key, line",
    [
        ("name: x\nworld: {}\ncolour: red\n", "'colour'", 3),
        ("name: x\n\n# a comment\n1: a\ncolour: red\n", "1", 4),  # mixed key types: sorted, not a TypeError
    ],
    ids=["word", "number"],
)
def test_unknown_top_level_key_names_its_line(env, content, key, line):
    p = env.file("pipe.yaml", content)
    check(env, ["run", p, "--runs-dir", env.runs], f"pipe.yaml:{line}: unknown top-level key {key}")


def test_unknown_top_level_key_in_an_extended_file(env):
    env.file("base.yaml", "name: x\nworld: {}\nstges: [world]\n")
    p = env.file("pipe.yaml", "extends: base.yaml\nworld: {seed: 3}\n")
    check(env, ["run", p, "--runs-dir", env.runs], "base.yaml:3: unknown top-level key 'stges'")
