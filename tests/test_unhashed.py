"""One way for a setting to stay out of an artifact's hash (`config.unhashed`; `unhashed_since_built`
for one that was hashed once): changing such a setting keeps the artifact id (a rerun reuses or resumes the artifact), changing any other one
gives a new id, and the manifest's config still records both."""

import dataclasses

import pytest

from r3rag.stages import eval as eval_stage
from r3rag.stages import rl, sft, synthesize, world
from r3rag.stages.common import Context
from r3rag.util.config import hashed_settings, hashed_when_set, unhashed

# stage module, settings that only say how to run, a setting that changes what is made
CASES = [
    (
        rl,
        {"threads": 4, "resume": True, "report_to": ["tensorboard"], "vllm_server_url": "http://h:1"},
        {"beta": 0.001},
    ),
    (synthesize, {"threads": 4, "concurrency": 2, "timeout": 5.0, "max_retries": 1, "batch_size": 8}, {"top_k": 5}),
    (sft, {"threads": 4}, {"lr": 1e-4}),
    (eval_stage, {"threads": 4, "static_cache": True}, {"batch_size": 4}),  # sampled draws follow the batches
    (world, {"data_root": "/elsewhere"}, {"seed": 1}),
]


@pytest.mark.parametrize("module, how, what", CASES, ids=[c[0].__name__.rsplit(".", 1)[1] for c in CASES])
def test_unhashed_settings_keep_the_artifact_id_and_others_change_it(tmp_path, module, how, what):
    ctx = Context(runs_dir=tmp_path)
    stage = module.__name__.rsplit(".", 1)[1]
    base = ctx.writer(stage, module.Config(), {}, module.INPUTS)
    same = ctx.writer(stage, module.Config(**how), {}, module.INPUTS)
    other = ctx.writer(stage, module.Config(**what), {}, module.INPUTS)
    assert same.id == base.id
    assert other.id != base.id
    assert all(same.config[k] == v for k, v in how.items())  # recorded in the manifest all the same
    for key in how:  # each one alone, too
        assert ctx.writer(stage, module.Config(**{key: how[key]}), {}, module.INPUTS).id == base.id, key


def test_no_stage_keeps_its_own_list_of_unhashed_settings():
    for module, how, _ in CASES:
        assert not hasattr(module.Config, "UNHASHED") and not hasattr(module, "OPERATIONAL")
        marked = {
            f.name for f in dataclasses.fields(module.Config) if f.metadata.get("hashed") in (False, "as_default")
        }
        assert set(how) <= marked, module.__name__


@dataclasses.dataclass
class Inner:
    x: int = 1
    workers: int = unhashed(8)


@dataclasses.dataclass
class Outer:
    a: int = 1
    b: int = unhashed(2)
    c: list = unhashed(default_factory=list)
    inner: Inner = dataclasses.field(default_factory=Inner)
    named: dict[str, Inner] = dataclasses.field(default_factory=lambda: {"k": Inner()})
    pair: tuple = (1, 2)


def test_hashed_settings_leaves_out_the_unhashed_fields_only_at_any_depth():
    assert hashed_settings(Outer()) == {"a": 1, "inner": {"x": 1}, "named": {"k": {"x": 1}}, "pair": (1, 2)}
    assert hashed_settings(Outer(b=5, inner=Inner(workers=1))) == hashed_settings(Outer())
    assert hashed_settings(Outer(inner=Inner(x=2))) != hashed_settings(Outer())
    # Without unhashed fields it is `asdict`: the ids of configs that have none stay what they were.
    plain = dataclasses.make_dataclass("Plain", [("a", int, 1), ("b", list, dataclasses.field(default_factory=list))])
    assert hashed_settings(plain()) == dataclasses.asdict(plain())


@dataclasses.dataclass
class Grown:
    a: int = 1
    added: str = hashed_when_set("first")


def test_a_setting_added_later_enters_the_hash_only_when_set():
    before = dataclasses.make_dataclass("Before", [("a", int, 1)])
    assert hashed_settings(Grown()) == hashed_settings(before())  # old artifacts keep their ids
    assert hashed_settings(Grown(added="all")) == {"a": 1, "added": "all"}
    assert hashed_settings(Grown(a=2)) != hashed_settings(Grown())


def test_a_setting_unhashed_since_built_keeps_the_ids_built_with_it():
    """`unhashed_since_built`: hashed at its default whatever its value, so the artifacts built while
    it was hashed (at that default) keep their ids, and another value keeps them too."""
    from r3rag.util.config import unhashed_since_built

    @dataclasses.dataclass
    class Then:
        lr: float = 1e-3
        url: str = ""

    @dataclasses.dataclass
    class Now:
        lr: float = 1e-3
        url: str = unhashed_since_built("")

    assert hashed_settings(Now(url="http://h:1")) == hashed_settings(Now()) == hashed_settings(Then())
    assert hashed_settings(Now(lr=1e-4)) != hashed_settings(Now())


def test_a_silent_setting_at_its_default_is_not_recorded_and_is_when_set():
    """Settings added with hashed_when_set(silent=True) leave an old artifact's config.yaml (and so
    its content hash and every id downstream) as it was while at their defaults."""
    from r3rag.stages.rl import Config
    from r3rag.util.config import recorded_settings

    assert "algorithm" not in recorded_settings(Config()) and "kl_coef" not in recorded_settings(Config())
    assert recorded_settings(Config(algorithm="ppo"))["algorithm"] == "ppo"
    assert "steps" in recorded_settings(Config())  # every other setting as before
