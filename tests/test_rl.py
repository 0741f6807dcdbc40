"""GRPO: retrieved tokens get exactly zero gradient, EOS handling, the rl stage's outputs,
resume after a kill, recipe pipelines that parse, and a clear error for missing vLLM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.core.protocol import Protocol
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.rl.grpo import rollout_batch
from r3rag.training.helpers import completion_with_eos
from r3rag.training.modeling import tiny_model, train_word_tokenizer
from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.grad_helpers import keep_final_hidden

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    {"id": "p1", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs ."},
    {"id": "c1", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar ."},
]
P = Protocol(template="minimal", doc_style="plain")
Q = {"id": "q", "question": "Where is it ?", "golden_answers": ["Velmar"]}
RIGHT = [
    "<search> Ava Smith works </search>",
    "<search> Zentro Labs headquartered </search>",
    "<answer> Velmar </answer>",
]
LOST = ["<search> Ava Smith works </search>", "<search> Ava Smith </search>", "<search> Smith </search>"]


def _rollouts(tok, script, max_turns=3):
    gen = ScriptedGenerator(lambda t: script[t.model_turn_count()], tok)
    return run_rollouts([Q], gen, BM25Retriever.build(DOCS), P, EnvConfig(top_k=1, max_turns=max_turns), tok)[0]


def _tokenizer():
    return train_word_tokenizer([d["text"] for d in DOCS] + ["Question : Where is it ?", "<eos>"])


def test_eos_the_env_appended_is_masked_and_kept_under_a_budget():
    """RL: the scripted turns stop at </answer> and never sample EOS, so the EOS appended for TRL
    (which must end every completion) gets no gradient, after an answer or not; SFT's rule (EOS
    learned after an answer) is `eos_rule="answer"`."""
    tok = _tokenizer()
    eos = tok.eos_token_id
    right, lost = _rollouts(tok, RIGHT), _rollouts(tok, LOST)
    assert right.finish_reason == "answer" and lost.finish_reason == "max_turns"
    batch = rollout_batch([right, lost], eos, 512)
    assert [ids[-1] for ids in batch["completion_ids"]] == [eos, eos]  # TRL never sees a "truncated" sample
    assert [m[-1] for m in batch["env_mask"]] == [0, 0]  # never sampled: no gradient
    assert completion_with_eos(right, eos)[1][-1] == 1 and completion_with_eos(lost, eos)[1][-1] == 0  # SFT's rule
    ids, mask = completion_with_eos(right, eos, budget=10)
    assert len(ids) == 10 and ids[-1] == eos and mask[-1] == 0
    assert ids[:-1] == right.completion()[0][:9]


def test_unmasked_ablation_puts_retrieved_tokens_in_the_loss_and_keeps_the_eos_rule():
    tok = _tokenizer()
    right, lost = _rollouts(tok, RIGHT), _rollouts(tok, LOST)
    masked = rollout_batch([right, lost], tok.eos_token_id, 512)
    unmasked = rollout_batch([right, lost], tok.eos_token_id, 512, mask_retrieved=False)
    assert unmasked["completion_ids"] == masked["completion_ids"]
    for m_on, m_off in zip(masked["env_mask"], unmasked["env_mask"]):
        assert 0 in m_on[:-1] and set(m_off[:-1]) == {1}  # retrieved tokens: masked, then trained on
        assert m_off[-1] == m_on[-1]  # EOS keeps its own rule (learned only where sampled), either way
    assert [m[-1] for m in unmasked["env_mask"]] == [0, 0]


def test_grpo_loss_gives_retrieved_tokens_exactly_zero_gradient(tmp_path):
    """Through TRL's GRPOTrainer: the hidden state that predicts an environment token (or the
    masked EOS of a trajectory without an answer) gets exactly zero gradient; model tokens do not."""
    from r3rag.rl.grpo import build_trainer
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.stages.rl import Config

    tok = _tokenizer()
    trajs = [_rollouts(tok, RIGHT), _rollouts(tok, LOST)]
    scorer = RewardScorer({"em": 1.0}, RewardSettings(), P)
    cfg = Config(steps=1, prompts_per_step=1, num_generations=2, bf16=False, save_steps=0, lr=1e-3)
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64)
    trainer = build_trainer(model, tok, [Q], None, P, scorer, cfg, tmp_path)
    batch = rollout_batch(trajs, tok.eos_token_id, 512)
    trainer.rollout_func = lambda prompts, tr: {**batch, "scores": scorer.score(trajs, [Q, Q]), "timing": {}}
    captured = keep_final_hidden(model)
    seen_ids = []
    model.register_forward_pre_hook(lambda m, args, kw: seen_ids.append(kw["input_ids"]), with_kwargs=True)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    (hidden,) = captured
    input_ids = seen_ids[-1]
    n_prompt = len(trajs[0].prompt_ids)
    grad = hidden.grad.abs().sum(-1)
    for i, mask in enumerate(batch["env_mask"]):
        # TRL shuffles the batch: find this trajectory's row by its token ids
        ids = torch.tensor(trajs[i].prompt_ids + batch["completion_ids"][i])
        (row,) = [r for r in range(len(input_ids)) if torch.equal(input_ids[r, : len(ids)], ids)]
        g = grad[row, n_prompt - 1 : n_prompt - 1 + len(mask)]  # hidden state n_prompt-1+j predicts token j
        m = torch.tensor(mask, dtype=torch.bool)
        assert torch.all(g[~m] == 0), i
        assert torch.all(g[m] > 0), i
        assert (~m).sum() > 10  # the documents really are in there
        assert grad[row, : n_prompt - 1].sum() == 0 and grad[row, n_prompt - 1 + len(mask) :].sum() == 0
    assert any((a - b).abs().max() > 0 for a, b in zip(before, model.parameters()))


def test_rl_stage_writes_metrics_rollouts_and_reward_curves(pipeline_runs):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl

    runs, _ = pipeline_runs
    ref = run_stage(
        "rl",
        None,
        [
            "name=observe",
            "steps=2",
            "prompts_per_step=2",
            "num_generations=2",
            "bf16=false",
            "max_turns=2",
            "max_new_tokens=12",
            "save_steps=1",
            "rollout_samples=1",
            "rewards={em: 1.0, search_r1_format: 0.5, r3rag: 0.0}",
        ],
        runs,
    )
    rows = read_jsonl(ref.path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward",
        "rewards/em/mean",
        "rewards/f1/mean",
        "rewards/cover/mean",
        "rewards/format/mean",
        "rewards/search_r1_format/mean",
        "rewards/r3rag/mean",
        "rollout/searches",
        "rollout/finish_answer",
        "completions/mean_length",
        "entropy",
        "time/step",
        "time/generation",
        "time/retrieval",
        "time/optimizer",
    ):
        assert key in rows[0], key
    assert 0 <= rows[0]["rollout/finish_answer"] <= 1 and rows[0]["time/step"] > rows[0]["time/generation"] > 0
    rollouts = read_jsonl(ref.path / "rollouts.jsonl")
    assert [r["step"] for r in rollouts] == [1, 2] and set(rollouts[0]["scores"]) >= {"em", "r3rag"}
    assert (ref.path / "reward_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert ref.manifest["metrics"]["steps"] == 2 and "last_rewards/em/mean" in ref.manifest["metrics"]
    assert not list((runs / "rl").glob(".work-*"))  # checkpoints removed once published


# The smallest GRPO run the subprocess tests start: 2 prompts x 2 generations of short turns, one thread.
TINY_RL = {
    "prompts_per_step": 2,
    "num_generations": 2,
    "bf16": "false",
    "max_turns": 2,
    "max_new_tokens": 12,
    "threads": 1,
}


def _rl_args(runs, **settings) -> list[str]:
    """`rl --runs-dir RUNS --set key=value ...`: TINY_RL's settings and `settings` (which win)."""
    sets = [f"{k}={v}" for k, v in {**TINY_RL, **settings}.items()]
    return ["rl", "--runs-dir", str(runs), *(arg for s in sets for arg in ("--set", s))]


def _rl_cmd(runs, *extra):
    return [sys.executable, "-m", "r3rag.cli", *_rl_args(runs, name="killed", steps=12, save_steps=2), *extra]


@pytest.mark.slow  # a GRPO run killed in a subprocess, then resumed: ~34 s (2 AVX2 cores)
def test_resume_after_a_kill_continues_from_the_last_checkpoint(pipeline_runs):
    from r3rag.util.jsonl import read_jsonl

    runs, _ = pipeline_runs
    proc = subprocess.Popen(_rl_cmd(runs), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((runs / "rl").glob(".work-*/checkpoints/checkpoint-4/r3rag_train_*")):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (work,) = (runs / "rl").glob(".work-*")
    complete = [p for p in (work / "checkpoints").glob("checkpoint-*") if (p / "trainer_state.json").exists()]
    last = max(int(p.name.split("-")[1]) for p in complete)  # a kill during a save leaves one incomplete
    assert 2 <= last < 12
    record = work / "checkpoints" / f"checkpoint-{last}" / "r3rag_train_seconds.json"
    before = json.loads(record.read_text())["train_seconds"] if record.exists() else None  # killed before it?
    out = subprocess.run(_rl_cmd(runs, "--resume"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    art = Path(out.stdout.strip().splitlines()[-1])
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["metrics"]["resumed_from_step"] == last
    m = manifest["metrics"]  # the training time counts the killed leg up to its checkpoint too
    assert 0 < m["train_seconds_before_resume"] < m["train_seconds"] <= manifest["seconds"] + 0.05
    assert m["train_seconds_before_resume"] == before or (before is None and last > 4)  # killed mid-save
    steps = [r["step"] for r in read_jsonl(art / "metrics.jsonl")]
    assert steps == list(range(1, 13))  # the killed run's steps up to the checkpoint, then the rest once


def test_resume_without_a_checkpoint_is_a_clear_error(pipeline_runs):
    runs, _ = pipeline_runs
    out = r3rag_inprocess("rl", "--runs-dir", str(runs), "--set", "name=never-started", "--resume")
    assert_one_line_error(out, "rl --resume: no checkpoint")


def test_vllm_asked_for_but_missing_is_a_clear_error(pipeline_runs):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    runs, _ = pipeline_runs
    out = r3rag_inprocess("rl", "--runs-dir", str(runs), "--set", "vllm=colocate")
    assert_one_line_error(out, "rl.vllm=colocate: vLLM is not installed")


@pytest.mark.parametrize("installed, gpu, expected", [(True, True, "colocate"), (True, False, ""), (False, True, "")])
def test_vllm_auto_uses_vllm_only_where_it_is_installed_and_a_gpu_is_present(monkeypatch, installed, gpu, expected):
    import importlib.util

    from r3rag.rl.grpo import resolve_vllm

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (object() if installed else None) if name == "vllm" else find_spec(name, *a),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert resolve_vllm("auto") == expected
    assert resolve_vllm("") == ""
    with pytest.raises(UserError, match="expected auto"):
        resolve_vllm("vllm")


# The real-model recipes for GPUs (tests/test_cli.py dry-runs them too)
GPU_RECIPES = [
    "search-r1-qwen2.5-3b.yaml",
    "r3rag-qwen2.5-7b.yaml",
    "search-r1-qwen2.5-3b-ppo.yaml",
    "r3rag-qwen2.5-7b-ppo.yaml",
]


@pytest.mark.parametrize("name", [*GPU_RECIPES, "demo.yaml"])
def test_recipe_pipelines_parse_with_the_config_loader(name):
    from r3rag.experiments.pipeline import _load_pipeline, _section
    from r3rag.stages import STAGE_ORDER, stage_module
    from r3rag.stages.rl import validate
    from r3rag.util.config import build_config

    path = ROOT / "pipelines" / name
    data = _load_pipeline(path)
    stages = data.get("stages") or [s for s in STAGE_ORDER if s in data]
    configs = {s: build_config(stage_module(s).Config, _section(data, s, path), where=f"{path}: {s}") for s in stages}
    assert "rl" in configs
    rl = configs["rl"]
    validate(rl)
    if name.endswith("-ppo.yaml"):  # the seeds' PPO: KL in the reward, a critic 10-18x the actor's lr
        assert rl.algorithm == "ppo" and rl.beta == 0 and rl.kl_coef > 0 and rl.critic_lr >= 10 * rl.lr
        assert (rl.value_clip, rl.ppo_unit) == ((0.2, "step") if name.startswith("r3rag") else (0.5, "trajectory"))
    elif name != "demo.yaml":
        assert rl.lr <= 1e-6 and rl.beta > 0 and rl.num_generations in (4, 5) and rl.top_k in (2, 3)


@pytest.mark.parametrize("name", ["cpu-2proc.yaml", "zero2.yaml", "zero3.yaml", "fsdp.yaml"])
def test_accelerate_configs_are_valid_yaml(name):
    import yaml

    cfg = yaml.safe_load((ROOT / "pipelines" / "accelerate" / name).read_text())
    assert cfg["num_processes"] >= 2 and cfg["distributed_type"] in ("MULTI_GPU", "DEEPSPEED", "FSDP")


@pytest.mark.slow  # accelerate launches two processes, each importing torch: ~23 s a case (2 AVX2 cores)
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_two_processes_on_cpu_each_roll_out_their_share(pipeline_runs, tmp_path, algorithm):
    """accelerate launch --num_processes 2 on CPU (gloo): the run finishes, both ranks contribute
    rollouts; PPO's critic trains under DDP beside the policy and goes into each checkpoint."""
    from r3rag.util.jsonl import read_jsonl

    extra = {"algorithm": "ppo", "save_steps": 1} if algorithm == "ppo" else {}

    runs, _ = pipeline_runs
    port = str(29500 + os.getpid() % 1000)
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "pipelines/accelerate/cpu-2proc.yaml"),
        "--main_process_port",
        port,
        "-m",
        "r3rag.cli",
        *_rl_args(runs, name=f"two-{algorithm}", steps=2, rollout_samples=2, **extra),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    art = Path(out.stdout.strip().splitlines()[-1])
    assert out.stdout.count(art.name) == 1  # the main process prints the path; the other rank, nothing
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["metrics"]["processes"] == 2
    rollouts = read_jsonl(art / "rollouts.jsonl")
    assert {r["rank"] for r in rollouts} == {0, 1}
    assert {(r["step"], r["rank"]) for r in rollouts} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    rows = read_jsonl(art / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert ("critic/value_loss" in rows[0]) == (algorithm == "ppo")


def test_rl_manifest_seconds_cover_training(pipeline_runs):
    """`seconds` (what eval's per-stage table shows) counts training, not only publishing."""
    _, refs = pipeline_runs
    m = refs["rl"].manifest
    assert m["seconds"] >= m["metrics"]["train_seconds"] - 0.05 > 0  # train_seconds is rounded to 0.1 s


def test_resume_skips_a_checkpoint_whose_state_file_was_cut_short(tmp_path):
    """A kill while the Trainer writes trainer_state.json leaves it empty or partial: resume from the one before."""
    from r3rag.training.checkpoints import last_complete_checkpoint

    for step, state in ((2, '{"global_step": 2}'), (4, ""), (6, '{"global_st')):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-8").mkdir()  # killed before the state file
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")


def test_resume_auto_continues_where_a_checkpoint_is_and_starts_afresh_where_none_is(tmp_path):
    """What a rerun experiment needs: `rl.resume=auto` never fails for want of a checkpoint."""
    from types import SimpleNamespace

    import pytest

    from r3rag.stages.rl import _prepare_work
    from r3rag.util.errors import UserError

    state = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    fresh = tmp_path / "fresh"
    assert _prepare_work(fresh, "auto", state) is None and fresh.is_dir()
    with pytest.raises(UserError, match="no checkpoint"):
        _prepare_work(fresh, True, state)
    killed = tmp_path / "killed"
    (killed / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (killed / "checkpoints" / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    assert _prepare_work(killed, "auto", state) == str(killed / "checkpoints" / "checkpoint-10")
    assert (killed / "checkpoints" / "checkpoint-10").is_dir()  # kept, not wiped as a fresh start would


def test_training_seconds_before_a_resume_come_from_the_checkpoint_or_the_logged_step_times(tmp_path):
    """TrainClock records the seconds trained at each checkpoint; a resumed run starts from that
    record, or, for a checkpoint without one, from the step times logged up to its step."""
    from types import SimpleNamespace

    from r3rag.training.observe import TrainClock, seconds_before

    ckpts, metrics = tmp_path / "checkpoints", tmp_path / "metrics.jsonl"
    rows = [(2, 1.5), (4, 2.0), (6, 600.0), (8, 9.0)]  # every other step; 6 was paused; 8 is after the checkpoint
    metrics.write_text("".join(json.dumps({"step": s, "reward": 0.0, "time/step": t}) + "\n" for s, t in rows))
    (ckpts / "checkpoint-6").mkdir(parents=True)
    assert seconds_before(str(ckpts / "checkpoint-6"), metrics) == 2.0 * 6  # the median step time x the steps
    clock = TrainClock(str(ckpts / "checkpoint-6"), metrics)
    assert clock.before == 12.0 and 12.0 <= clock.seconds() < 13.0
    clock.before = 100.0  # as if much had been trained before: the next checkpoint records it
    (ckpts / "checkpoint-10").mkdir()
    state = SimpleNamespace(is_world_process_zero=True, global_step=10)
    clock.on_save(SimpleNamespace(output_dir=str(ckpts)), state, None)
    assert 100.0 <= seconds_before(str(ckpts / "checkpoint-10"), metrics) < 101.0
    assert TrainClock(None, metrics).before == 0.0


def test_an_rl_run_continues_from_another_rl_runs_policy_and_its_curve(pipeline_runs):
    """rl.policy naming an RL artifact (a long run's next link): it trains from that run's weights
    with its protocol, records it as its `rl` input, and its curve continues that run's steps."""
    from r3rag.experiments.pipeline import run_stage
    from r3rag.training.curves import run_curve
    from r3rag.training.modeling import load_policy

    runs, _ = pipeline_runs
    common = ["steps=1", "prompts_per_step=2", "num_generations=2", "bf16=false", "max_turns=2"]
    common += ["max_new_tokens=12", "save_steps=0", "lr=1e-3", "entropy_coef=0.01"]
    first = run_stage("rl", None, ["name=link1", *common], runs)
    second = run_stage("rl", None, ["name=link2", "seed=1", f"policy={first.path}", *common], runs)
    assert second.manifest["inputs"]["policy"]["stage"] == "rl"
    assert second.manifest["inputs"]["policy"]["id"] == first.id
    assert (
        json.loads((second.path / "policy.json").read_text())["protocol"]
        == json.loads((first.path / "policy.json").read_text())["protocol"]
    )
    a, _ = load_policy(first.path)
    b, _ = load_policy(second.path)
    assert any((x - y).abs().max() > 0 for x, y in zip(a.parameters(), b.parameters()))  # it trained on
    assert [r["step"] for r in run_curve(second.path)] == [1, 2]  # the first's step, then its own
    again = run_stage("rl", None, ["name=link2", "seed=1", f"policy=rl:{first.id}", *common], runs)
    assert again.id == second.id  # named by id or by path: the same input, the same artifact
