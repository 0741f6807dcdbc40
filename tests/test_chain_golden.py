"""The demo-sized chain (world -> index -> synthesize -> sft -> rl -> eval, the shared
`pipeline_runs` fixture) against tests/chain_golden.json: the artifact ids, content hashes, output
files and metrics the code wrote when the file was made. A change that only moves code (modules,
packages, names) leaves every one of them equal.

world, index and synthesize are plain Python, and sft's id hashes its config and synthesize's
content: those hold on any machine. The rest follows from trained weights, whose bits depend on the
CPU's kernels and torch's version (and whose files name transformers' version): the file holds
them per machine (AVX2 and AVX-512 machines both build this project), and each is checked where
this machine is one of them.

Rewrite this machine's entry after a change meant to alter them (about a minute on 2 cores):
    .venv/bin/python -m tests.test_chain_golden
A change to the portable part drops the other machines' entries (their weights came from the old
chain): rewrite the file on each kind of machine again.
"""

from __future__ import annotations

import json
import platform
import re
import tempfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).with_name("chain_golden.json")
PORTABLE = ("world", "index", "synthesize")
# wall times, rates and absolute paths differ between two runs of the same code
VARYING = re.compile(r"seconds|per_s|time|q/s")
UNHASHED = {"metrics.jsonl", "metrics.json", "policy.json", "reward_curves.png"}  # times, paths, a plot


def steady(obj):
    if isinstance(obj, dict):
        return {k: steady(v) for k, v in obj.items() if not VARYING.search(k) and not _path(v)}
    return obj


def _path(value) -> bool:
    return isinstance(value, str) and value.startswith("/")


def machine() -> dict:
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,  # model/config.json records it: part of the content hash
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "arch": platform.machine(),
    }


def outputs(ref) -> dict:
    return {name: f["sha256"] for name, f in ref.manifest["outputs"].items() if name not in UNHASHED}


def record(refs: dict) -> dict:
    """What the golden file holds of a built chain: the portable part and this machine's entry."""
    metrics = json.loads((refs["eval"].path / "metrics.json").read_text())
    return {
        "portable": {
            **{s: {"id": refs[s].id, "content_hash": refs[s].content_hash} for s in PORTABLE},
            "metrics": {s: steady(refs[s].manifest["metrics"]) for s in PORTABLE},
            "sft_id": refs["sft"].id,
        },
        "trained": {
            "machine": machine(),
            "sft": {"content_hash": refs["sft"].content_hash, "metrics": steady(refs["sft"].manifest["metrics"])},
            "rl": {
                "id": refs["rl"].id,
                "outputs": outputs(refs["rl"]),
                "metrics": steady(refs["rl"].manifest["metrics"]),
            },
            "eval": {"outputs": outputs(refs["eval"]), "metrics": steady(metrics)},
        },
    }


def merged(golden: dict, now: dict) -> dict:
    """The golden file with this machine's entry in; other machines' kept while the portable part holds."""
    same_chain = golden.get("portable") == now["portable"]
    others = [t for t in golden.get("trained", []) if same_chain and t["machine"] != now["trained"]["machine"]]
    trained = sorted([*others, now["trained"]], key=lambda t: json.dumps(t["machine"], sort_keys=True))
    return {"portable": now["portable"], "trained": trained}


@pytest.fixture(scope="module")
def recorded(pipeline_runs):
    _, refs = pipeline_runs
    return record(refs), json.loads(GOLDEN.read_text())


def test_ids_and_data_match_the_golden_file(recorded):
    now, golden = recorded
    assert now["portable"] == golden["portable"]


def test_trained_artifacts_match_the_golden_file(recorded):
    now, golden = recorded
    held = [t for t in golden["trained"] if t["machine"] == now["trained"]["machine"]]
    if not held:
        machines = [t["machine"] for t in golden["trained"]]
        pytest.skip(f"no golden weights for {now['trained']['machine']} (held: {machines})")
    for stage in ("sft", "rl", "eval"):
        assert now["trained"][stage] == held[0][stage], stage


def test_a_rewrite_keeps_other_machines_unless_the_chain_moved():
    portable = {"world": {"id": "w1"}}
    avx2 = {"machine": {"cpu": "AVX2"}, "sft": 1}
    golden = {"portable": portable, "trained": [avx2, {"machine": {"cpu": "AVX512"}, "sft": 2}]}
    avx512 = {"machine": {"cpu": "AVX512"}, "sft": 3}
    assert merged(golden, {"portable": portable, "trained": avx512})["trained"] == [avx2, avx512]
    moved = {"world": {"id": "w2"}}
    assert merged(golden, {"portable": moved, "trained": avx512}) == {"portable": moved, "trained": [avx512]}


if __name__ == "__main__":
    from tests.conftest import build_chain

    with tempfile.TemporaryDirectory() as tmp:
        now = record(build_chain(Path(tmp) / "runs"))
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    written = merged(golden, now)
    GOLDEN.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    if golden and golden.get("portable") != now["portable"]:
        print("the portable part moved: other machines' entries dropped (rewrite the file on each again)")
    print(f"wrote {GOLDEN}: {len(written['trained'])} machine(s), this one {now['trained']['machine']}")
