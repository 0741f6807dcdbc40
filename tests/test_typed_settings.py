"""GRPO's settings are typed beside the trainer (r3rag.rl.settings) and the sub-settings the
stages share (env, question source) are one dataclass each: what grpo reads is declared there,
a misspelled choice is one line naming the allowed values, and the stages agree on the keys."""

import ast
import dataclasses
from pathlib import Path

import pytest

import r3rag
from r3rag.core.env import EnvSettings
from r3rag.rl.settings import GRPOSettings
from r3rag.stages import eval as eval_stage
from r3rag.stages import rl, synthesize
from r3rag.stages.common import QuestionSource
from r3rag.util.config import build_config
from r3rag.util.errors import UserError

SRC = Path(r3rag.__file__).parent


def _cfg_reads(path: Path) -> set[str]:
    """Attribute names read off `cfg` or `self.cfg` in a module."""
    reads = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "cfg":
                reads.add(node.attr)
            elif isinstance(owner, ast.Attribute) and owner.attr == "cfg":
                reads.add(node.attr)
    return reads


def test_everything_grpo_reads_is_a_declared_grpo_setting():
    declared = {f.name for f in dataclasses.fields(GRPOSettings)} | {"env_config"}
    for module in ("rl/grpo.py", "rl/settings.py"):
        reads = _cfg_reads(SRC / module)
        assert reads and reads <= declared, (module, sorted(reads - declared))
    assert "getattr(cfg" not in (SRC / "rl/grpo.py").read_text() + (SRC / "rl/settings.py").read_text()


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("loss_type", "dapoo", "dapo, grpo, dr_grpo"),
        ("scale_rewards", "std", "group, batch, none"),
        ("vllm", "yes", "auto, , colocate, server"),
        ("process_credit", "token", "trajectory, step"),
        ("keep", "best", "last, best_dev"),
    ],
)
def test_a_misspelled_grpo_choice_is_one_line_naming_the_allowed_values(key, value, allowed):
    with pytest.raises(UserError) as e:
        build_config(rl.Config, {key: value}, where="rl")
    assert str(e.value).startswith(f"rl.{key}: unknown value {value!r} (allowed: {allowed}")
    assert "\n" not in str(e.value)


def test_settings_built_in_code_are_checked_the_same_way():
    from r3rag.rl.rewards import R3ragWeights, RewardSettings

    with pytest.raises(UserError, match=r"^rl\.loss_type: unknown value 'dapoo' \(allowed: dapo, "):
        rl.Config(loss_type="dapoo")
    with pytest.raises(
        UserError, match=r"^reward\.relevance: unknown value 'bm25' \(allowed: gold, embedding, judge\)$"
    ):
        RewardSettings(relevance="bm25")
    with pytest.raises(UserError, match=r"^reward\.r3rag\.correct: unknown value 'f1' \(allowed: em, cover, judge\)$"):
        R3ragWeights(correct="f1")


@pytest.mark.parametrize(
    "module, key, value",
    [(synthesize, "match", "exactly"), (synthesize, "reader", "open-book"), (eval_stage, "backend", "tgi")],
)
def test_other_stage_choices_are_checked_when_the_config_is_built(module, key, value):
    with pytest.raises(UserError, match=rf"^s\.{key}: unknown value '{value}' \(allowed: "):
        build_config(module.Config, {key: value}, where="s")


def test_the_stages_share_one_env_and_one_question_source():
    env_keys = {f.name for f in dataclasses.fields(EnvSettings)}
    source_keys = {f.name for f in dataclasses.fields(QuestionSource)}
    for module in (rl, synthesize, eval_stage):
        assert issubclass(module.Config, EnvSettings) and issubclass(module.Config, QuestionSource)
        assert env_keys | source_keys <= {f.name for f in dataclasses.fields(module.Config)}
    assert issubclass(rl.Config, GRPOSettings)
    # Each stage keeps its own defaults where they differ.
    assert synthesize.Config().max_new_tokens == 256 and rl.Config().max_new_tokens == 48
    assert eval_stage.Config().split == "test" and eval_stage.Config().limit == 400 and rl.Config().split == "train"
    env = eval_stage.Config(top_k=5, max_turns=2).env_config("rag", top_k=7)
    assert (env.mode, env.top_k, env.max_turns, env.max_new_tokens) == ("rag", 7, 2, 48)
    assert eval_stage.Config(top_k=5).env_config().top_k == 5  # top_k=0: the setting's own


def test_synthesize_and_eval_systems_choose_a_protocol_with_the_same_keys():
    from r3rag.core.protocol import Protocol, ProtocolSettings
    from r3rag.evaluation.systems import SystemSpec

    assert issubclass(synthesize.Config, ProtocolSettings) and issubclass(SystemSpec, ProtocolSettings)
    assert synthesize.Config().chat is False and SystemSpec().chat is True  # instruct models are the usual systems
    p = synthesize.Config(protocol="r3rag", doc_style="plain", chat=True, max_doc_chars=99).to_protocol()
    assert p == Protocol(name="r3rag", template="search-r1", doc_style="plain", max_doc_chars=99, chat=True)
    with pytest.raises(UserError, match=r"^eval\.models\.x\.template: unknown value 'serch-r1'"):
        build_config(eval_stage.Config, {"models": {"x": {"model": "m", "template": "serch-r1"}}}, where="eval")


def test_the_judge_and_endpoint_systems_share_one_endpoint_settings_with_flat_keys():
    from r3rag.evaluation.judge import JudgeSpec
    from r3rag.evaluation.systems import SystemSpec
    from r3rag.generation.endpoint import EndpointSettings

    assert issubclass(JudgeSpec, EndpointSettings) and issubclass(SystemSpec, EndpointSettings)
    cfg = build_config(
        eval_stage.Config,
        {"judge": {"endpoint": "http://j", "model": "jm"}, "models": {"api": {"endpoint": "http://x", "model": "m"}}},
    )
    assert (cfg.judge.endpoint, cfg.models["api"].endpoint, cfg.models["api"].model) == ("http://j", "http://x", "m")
    with pytest.raises(UserError, match=r"^eval\.judge: set endpoint and model"):
        JudgeSpec(endpoint="http://j").client("eval.judge")  # no model: one line before any request


def test_a_question_source_reads_a_split_or_a_file(tmp_path):
    from types import SimpleNamespace

    world = tmp_path / "world"
    world.mkdir()
    (world / "dev.jsonl").write_text(
        "".join(f'{{"id": {i}, "question": "q{i} ?", "golden_answers": ["a"]}}\n' for i in range(3))
    )
    inputs = {"world": SimpleNamespace(path=world)}
    qs = QuestionSource(split="dev", limit=2).read_questions(inputs)
    assert [q["id"] for q in qs] == ["0", "1"]  # ids become strings, as a question file's do
    (tmp_path / "q.jsonl").write_text('{"id": 7, "question": "q ?", "golden_answers": ["a"]}\n')
    qs = QuestionSource().read_questions({**inputs, "questions": SimpleNamespace(path=tmp_path / "q.jsonl")})
    assert [q["id"] for q in qs] == ["7"]
