"""A killed `r3rag eval` resumes from its journal (r3rag.evaluation.resume): only the chunks left are
generated, and the predictions are a straight run's, sampled draws included."""

import json

import pytest

import r3rag.stages.eval as eval_stage
from r3rag.experiments.pipeline import run_stage
from r3rag.util.jsonl import read_jsonl

# 10 questions in chunks of 4 (batch_size 1 x 4): 0:4, 4:8, 8:10; two sampled draws each
SETTINGS = [
    "limit=10",
    "max_turns=3",
    "max_new_tokens=16",
    "rl=",
    "systems=[sft]",
    "batch_size=1",
    "temperature=1.0",
    "n_samples=2",
]


def _answers(ref) -> list[tuple]:
    rows = read_jsonl(ref.path / "predictions.jsonl")
    return [(r["id"], r["sample"], r["answer"], json.dumps(r["turns"])) for r in rows]


def test_a_killed_eval_resumes_where_it_stopped_and_writes_a_straight_runs_predictions(pipeline_runs, monkeypatch):
    runs, _ = pipeline_runs
    straight = run_stage("eval", None, [*SETTINGS, "name=straight"], runs)
    real, calls = eval_stage.run_rollouts, []

    def killed_after(n):
        def rollouts(batch, *args, **kwargs):
            if len(calls) == n:
                raise RuntimeError("killed")
            calls.append([q["id"] for q in batch])
            return real(batch, *args, **kwargs)

        return rollouts

    monkeypatch.setattr(eval_stage, "run_rollouts", killed_after(4))  # draw 0's three chunks, draw 1's first
    with pytest.raises(RuntimeError, match="killed"):
        run_stage("eval", None, [*SETTINGS, "name=resumed"], runs)
    (journal,) = (runs / "eval").glob(".journal-resumed-*.jsonl")
    assert len(journal.read_text().splitlines()) == 4 and not list((runs / "eval").glob("resumed-*"))
    monkeypatch.setattr(eval_stage, "run_rollouts", killed_after(len(calls) + 99))
    resumed = run_stage("eval", None, [*SETTINGS, "name=resumed"], runs)
    assert [len(c) for c in calls] == [4, 4, 2, 4, 4, 2]  # the rerun generated draw 1's last two chunks only
    assert _answers(resumed) == _answers(straight)  # the same draws: the random state was put back
    metrics = json.loads((resumed.path / "metrics.json").read_text())["systems"]["sft"]
    assert metrics["n"] == 10 and metrics["samples"] == 2 and metrics["seconds"] > 0
    assert not journal.exists()  # the artifact is committed: its journal is gone
