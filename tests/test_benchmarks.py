"""The benchmark scripts still run and end with their one line of JSON (figures not checked:
timings on a shared CI machine mean nothing; the ratios are recorded in benchmarks/RESULTS.md)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow  # the rollout benchmark as a script: ~13 s (2 AVX2 cores)
def test_rollout_benchmark_prints_its_keys(tmp_path):
    # tmp_path has no runs/sft: the script falls back to a random tiny model
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "rollout.py"), "--n", "4", "--repeats", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["n"] == 4 and "random tiny model" in out.stdout
    # steered to search twice, then answer: also through the KV cache kept between turns
    assert re.search(r"3\.00 model turns", out.stdout), out.stdout
    assert figures["rollout_batching_speedup"] > 0 and figures["env_overhead_cpu"] > -1
    shares = figures["share_encode"] + figures["share_decode"] + figures["share_outside_model"]
    assert abs(shares - 1) < 0.01


@pytest.mark.slow  # the real-model benchmark on SmolLM2: ~25 s, after the model's import (2 AVX2 cores)
@pytest.mark.timeout(1500)  # a 135M model through every stage on 2 cores: minutes, more on a loaded machine
def test_real_model_benchmark_quick(smollm2_runs, tmp_path):
    """The real-model benchmark's generate and env parts, shrunk (its SFT and GRPO parts take
    minutes even shrunk; `--quick` alone runs all four)."""
    _, ref = smollm2_runs
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "real_model.py"),
            "--quick",
            "--sections",
            "generate,env",
            "--model",
            str(ref.path / "model"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(figures) >= {"real_generate_tok_s_bs16", "real_sft_tok_s", "real_grpo_step_s", "real_env_overhead_cpu"}
    assert figures["quick"] is True and figures["real_generate_tok_s_bs16"] > 0
    assert figures["real_env_overhead_cpu"] > -1 and figures["real_sft_tok_s"] is None  # not measured
    assert figures["env_searches"] > 0  # steered (ForcedTurns): rows search
