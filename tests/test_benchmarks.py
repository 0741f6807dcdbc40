"""The benchmark scripts still run and end with their one line of JSON (figures not checked:
timings on a shared CI machine mean nothing; the ratios are recorded in benchmarks/RESULTS.md)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_rollout_benchmark_prints_its_keys(tmp_path):
    # tmp_path has no runs/sft: the script falls back to a random tiny model
    out = subprocess.run([sys.executable, str(BENCHMARKS / "rollout.py"), "--n", "4", "--repeats", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["n"] == 4 and "random tiny model" in out.stdout
    # steered to search twice, then answer: also through the KV cache kept between turns
    assert re.search(r"3\.00 model turns", out.stdout), out.stdout
    assert figures["rollout_batching_speedup"] > 0 and figures["env_overhead_cpu"] > -1
    shares = figures["share_encode"] + figures["share_decode"] + figures["share_outside_model"]
    assert abs(shares - 1) < 0.01
