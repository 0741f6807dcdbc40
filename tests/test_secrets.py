"""Secrets: an API key comes only from an environment variable, reaches the endpoint's
Authorization header, and is never written anywhere else: not in any file of the runs dir
(artifacts, manifests, configs, temp and work dirs), not in the console output, not in an
error message when the endpoint rejects it. Runs the real CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chat_server import ChatServer

KEY_ENV = "R3RAG_TEST_SECRET_KEY"
KEY = "sk-r3rag-Zq8vN3xK7pL2mW9tR4yB6cD1"


def leaks(root: Path, *texts: str) -> list[str]:
    """Where the key (or a 12-character piece of it) shows up: files under root, or the texts."""
    pieces = [KEY, KEY[-12:], KEY[8:20]]
    found = []
    for p in root.rglob("*"):
        if p.is_file() and any(piece.encode() in p.read_bytes() for piece in pieces):
            found.append(str(p))
    found += [f"output {i}" for i, t in enumerate(texts) if any(piece in t for piece in pieces)]
    return found


def cli(runs: Path, *sets: str, flags: tuple = ()):
    """`r3rag eval` in a subprocess with the key in its environment."""
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run(
        [sys.executable, "-m", "r3rag.cli", "eval", "--runs-dir", str(runs), *flags, *args],
        capture_output=True,
        text=True,
        env={**os.environ, KEY_ENV: KEY},
        timeout=300,
    )


@pytest.fixture(scope="module")
def runs(world_index_runs):
    return world_index_runs


def policy(body):
    if len(body["messages"]) == 1:
        return "<search> " + body["messages"][0]["content"].split("Question :")[-1].strip()
    return "<answer> Nowhere"


def endpoint_sets(pol_url: str, judge_url: str, name: str) -> list[str]:
    return [
        "systems=[api]",
        f"models.api.endpoint={pol_url}",
        "models.api.model=m",
        f"models.api.api_key_env={KEY_ENV}",
        "models.api.template=minimal",
        "models.api.doc_style=plain",
        f"judge.endpoint={judge_url}",
        "judge.model=j",
        f"judge.api_key_env={KEY_ENV}",
        "sft=",
        "rl=",
        "limit=4",
        "max_turns=3",
        f"name={name}",
    ]


@pytest.mark.slow  # the CLI end to end in a subprocess against two chat servers: ~5 s (2 AVX2 cores)
def test_key_reaches_the_endpoint_and_nothing_else(runs):
    with ChatServer(reply=policy) as pol, ChatServer(reply=lambda b: "Final answer: True") as jud:
        out = cli(runs, *endpoint_sets(pol.url, jud.url, "secret"))
    assert out.returncode == 0, out.stderr[-2000:]
    auth = {r["headers"].get("Authorization") for srv in (pol, jud) for r in srv.requests}
    assert auth == {f"Bearer {KEY}"} and len(pol.requests) == 8 and len(jud.requests) == 4
    assert list(runs.glob("eval/secret-*/manifest.json"))  # the run happened and was published
    assert not leaks(runs, out.stdout, out.stderr)
    assert leaks(runs, f"x{KEY[-12:]}x") == ["output 0"]  # the detector itself works
    manifest = next(runs.glob("eval/secret-*/manifest.json")).read_text()
    assert KEY_ENV in manifest  # the variable's name is recorded (so a rerun knows what to set), not its value


@pytest.mark.slow  # the CLI end to end in a subprocess against two chat servers: ~6 s (2 AVX2 cores)
def test_rejected_key_is_not_echoed(runs):
    with ChatServer(reply=policy, faults=lambda body: "401") as pol, ChatServer(reply=lambda b: "x") as jud:
        out = cli(runs, *endpoint_sets(pol.url, jud.url, "rejected"))
        dbg = cli(runs, *endpoint_sets(pol.url, jud.url, "rejected"), flags=("--debug",))
    assert out.returncode != 0 and "401" in out.stderr, out.stderr[-2000:]
    assert dbg.returncode != 0 and "Traceback" in dbg.stderr  # even a traceback holds no key
    assert not leaks(runs, out.stdout, out.stderr, dbg.stdout, dbg.stderr)
    assert not list(runs.glob("eval/rejected-*"))


def test_missing_key_variable_is_one_clear_error(runs, monkeypatch):
    from tests.cli_helpers import assert_one_line_error, r3rag_inprocess

    monkeypatch.delenv(KEY_ENV, raising=False)
    sets = endpoint_sets("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", "nokey")
    out = r3rag_inprocess("eval", "--runs-dir", runs, *[a for s in sets for a in ("--set", s)])
    assert_one_line_error(out, KEY_ENV, "is not set")
