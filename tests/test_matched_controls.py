"""GRPO's matched controls (issue 17): more SFT from the cold-start policy for a fixed number of
updates (`sft.model` = a policy, `sft.max_steps`), and rejection-sampling fine-tuning's data
(`synthesize.keep=all`: a sampled group per question, every distinct correct one kept)."""

import pytest

from r3rag.core.protocol import Protocol
from r3rag.experiments.pipeline import run_stage
from r3rag.util.config import hashed_settings
from r3rag.util.jsonl import read_jsonl
from tests.chat_server import ChatServer
from tests.world_teacher import WorldTeacher, question_of

TINY_SFT = ["layers=1", "hidden=32", "heads=2", "intermediate=64", "bf16=false", "lr=1e-2"]


@pytest.fixture(scope="module")
def runs(teacher_runs):
    return teacher_runs


def test_new_settings_at_their_defaults_leave_the_hash_alone():
    from r3rag.stages import sft, synthesize

    assert "max_steps" not in hashed_settings(sft.Config())
    assert hashed_settings(sft.Config(max_steps=200))["max_steps"] == 200
    assert "keep" not in hashed_settings(synthesize.Config())
    assert hashed_settings(synthesize.Config(keep="all"))["keep"] == "all"


def test_more_sft_starts_from_the_given_policy_and_runs_exactly_max_steps(runs, monkeypatch):
    """A cold start, then SFT from its `model/` for 5 updates over 8 trajectories in batches of 4 (2 per
    pass: the data is cycled): the trainer starts from the policy's weights and tokenizer and moves them."""
    import torch

    from r3rag.stages import sft
    from r3rag.training.modeling import load_policy

    cold = run_stage("sft", None, [*TINY_SFT, "batch_size=16", "limit=32", "name=cold"], runs)
    seen = {}
    train = sft.train_sft

    def spy(model, tokenizer, *args, **kwargs):
        seen["start"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        seen["vocab"] = tokenizer.get_vocab()
        return train(model, tokenizer, *args, **kwargs)

    monkeypatch.setattr(sft, "train_sft", spy)
    more = run_stage(
        "sft",
        None,
        [*TINY_SFT, f"model={cold.path}/model", "max_steps=5", "batch_size=4", "limit=8", "name=more"],
        runs,
    )
    policy, tok = load_policy(cold.path)
    assert seen["vocab"] == tok.get_vocab()
    start = policy.state_dict()
    assert seen["start"].keys() == start.keys() and all(torch.equal(seen["start"][k], start[k]) for k in start)
    after, _ = load_policy(more.path)
    moved = [k for k, v in after.state_dict().items() if not torch.equal(v, start[k])]
    assert moved, "training changed no weight"
    m = more.manifest["metrics"]
    assert m["steps"] == 5 and m["epochs_trained"] == 2.5 and m["trajectories"] == 8
    assert more.manifest["config"]["max_steps"] == 5
    # The artifact directory names the same policy (its model/ inside), and epochs stays the default budget.
    again = run_stage("sft", None, [*TINY_SFT, f"model={cold.path}", "max_steps=5", "batch_size=4", "limit=8"], runs)
    assert again.manifest["metrics"]["steps"] == 5


def test_negative_max_steps_is_one_clear_error():
    from r3rag.stages import sft
    from r3rag.util.errors import UserError

    with pytest.raises(UserError, match="sft.max_steps"):
        sft.validate(sft.Config(max_steps=-1))


# ---------------------------------------------------------------- rejection sampling: synthesize keep=all


class ScriptedTeacherGenerator:
    """Answers every question at once; `script[qid][round]` is (answer, thought) for that attempt."""

    def __init__(self, questions, script, round_no, protocol):
        self.questions, self.script, self.round, self.protocol = questions, script, round_no, protocol

    def generate(self, contexts, stop, max_new_tokens):
        from r3rag.core.env import Generated

        by_text = {q["question"]: q for q in self.questions}
        outs = []
        for t in contexts:
            answer, thought = self.script[by_text[t.question]["id"]][self.round]
            outs.append(Generated(self.protocol.answer_turn(answer, thought), None, "stop"))
        return outs


def scripted_teacher(questions, script, protocol, temperatures):
    from r3rag.synthesis.teachers import Teacher

    def generator(qs, temperature):
        temperatures.append(temperature)
        return ScriptedTeacherGenerator(questions, script, len(temperatures) - 1, protocol)

    return Teacher("scripted", generator)


def test_keep_all_keeps_every_distinct_correct_sample_and_drops_wrong_ones(runs):
    from r3rag.core.artifacts import resolve
    from r3rag.retrieval import open_retriever
    from r3rag.stages.synthesize import Config
    from r3rag.synthesis.attempts import attempt_loop, summarize_rows, trajectory_rows

    qs = read_jsonl(resolve("world:latest", "world", runs).path / "train.jsonl")[:3]
    a, b, c = (q["id"] for q in qs)
    gold = {q["id"]: q["golden_answers"][0] for q in qs}
    script = {  # 4 sampled attempts each: a has 2 distinct correct (one repeated) and a wrong one; b none; c one x4
        a: [(gold[a], "x"), (gold[a], "x"), ("Nowhere", "x"), (gold[a], "y")],
        b: [("Nowhere", "x")] * 4,
        c: [(gold[c], "z")] * 4,
    }
    protocol, temperatures = Protocol(template="minimal"), []
    teacher = scripted_teacher(qs, script, protocol, temperatures)
    cfg = Config(attempts=4, temperature=0.3, keep="all", max_turns=2)
    retriever = open_retriever("", resolve("index:latest", "index", runs))
    rows = {r["id"]: r for r in attempt_loop(qs, teacher, retriever, protocol, cfg)}
    assert temperatures == [0.3] * 4  # every attempt sampled, none greedy
    assert (rows[a]["status"], rows[b]["status"], rows[c]["status"]) == ("accepted", "rejected", "accepted")
    written = {r["id"]: r for r in trajectory_rows(rows[a]) + trajectory_rows(rows[c])}
    assert sorted(written) == sorted([f"{a}#0", f"{a}#1", f"{c}#0"])
    assert [written[f"{a}#{k}"]["attempt"] for k in (0, 1)] == [1, 4]
    assert all(r["answer"] == gold[r["question_id"]] and r["golden_answers"] for r in written.values())
    assert [h["reason"] for h in rows[a]["rejected_attempts"]] == ["wrong_answer"]
    assert (rows[a]["duplicates"], rows[c]["duplicates"]) == (1, 3)
    assert [h["reason"] for h in rows[b]["attempts"]] == ["wrong_answer"] * 4
    m = summarize_rows(list(rows.values()), n_extra=0, resumed=0, wall=1.0)
    assert (m["accepted"], m["rejected"], m["attempts"]) == (2, 1, 12)
    assert (m["trajectories"], m["accepted_attempts"], m["duplicate_trajectories"]) == (3, 7, 4)
    assert m["rejected_attempts_by_reason"] == {"wrong_answer": 5}


def test_keep_first_is_unchanged_greedy_first_and_stops_at_the_first_correct(runs):
    from r3rag.core.artifacts import resolve
    from r3rag.retrieval import open_retriever
    from r3rag.stages.synthesize import Config
    from r3rag.synthesis.attempts import attempt_loop, summarize_rows, trajectory_rows

    qs = read_jsonl(resolve("world:latest", "world", runs).path / "train.jsonl")[:2]
    a, b = (q["id"] for q in qs)
    gold = {q["id"]: q["golden_answers"][0] for q in qs}
    script = {a: [("Nowhere", "x"), (gold[a], "x"), (gold[a], "y")], b: [(gold[b], "x")] * 3}
    protocol, temperatures = Protocol(template="minimal"), []
    teacher = scripted_teacher(qs, script, protocol, temperatures)
    cfg = Config(attempts=3, temperature=0.3, max_turns=2)
    retriever = open_retriever("", resolve("index:latest", "index", runs))
    rows = {r["id"]: r for r in attempt_loop(qs, teacher, retriever, protocol, cfg)}
    assert temperatures == [0.0, 0.3]  # greedy, then one sampled retry for the question still open
    assert (rows[a]["attempt"], rows[b]["attempt"]) == (2, 1) and "samples" not in rows[a]
    assert [r["id"] for r in trajectory_rows(rows[a])] == [a]
    m = summarize_rows(list(rows.values()), n_extra=0, resumed=0, wall=1.0)
    assert "duplicate_trajectories" not in m and m["attempts"] == 3


def test_synthesize_keep_all_writes_one_row_per_kept_sample(runs, monkeypatch):
    """Through the stage (an openai teacher on 127.0.0.1): ids `<qid>#<k>`, the rows `r3rag sft` reads,
    duplicates counted; a question the teacher always gets wrong goes to rejected.jsonl with every attempt."""
    from r3rag.core.artifacts import resolve
    from r3rag.core.env import Trajectory

    monkeypatch.setenv("R3RAG_TEST_KEY", "sk-test")
    qs = read_jsonl(resolve("world:latest", "world", runs).path / "train.jsonl")[:4]
    world_teacher = WorldTeacher(qs, wrong={qs[3]["id"]})
    answers = {}  # question -> answer turns so far: alternate two thoughts, so 3 attempts keep 2 distinct

    def reply(body):
        text = world_teacher(body)
        if "<answer>" in text and question_of(body) == qs[0]["question"]:
            n = answers[qs[0]["id"]] = answers.get(qs[0]["id"], -1) + 1
            text = text.replace("<think>", f"<think>take {n % 2}: ", 1)
        return text

    overrides = {
        "teacher": "openai",
        "model": "teacher-model",
        "api_key_env": "R3RAG_TEST_KEY",
        "attempts": 3,
        "temperature": 0.3,
        "keep": "all",
        "limit": 4,
        "template": "minimal",
        "doc_style": "plain",
        "name": "rft",
    }
    with ChatServer(reply=reply) as srv:
        ref = run_stage("synthesize", None, [f"{k}={v}" for k, v in {**overrides, "base_url": srv.url}.items()], runs)
    assert {r["body"]["temperature"] for r in srv.requests} == {0.3}
    rows = read_jsonl(ref.path / "trajectories.jsonl", required=("prompt", "turns"))
    ids = sorted(r["id"] for r in rows)
    first, second, third = (q["id"] for q in qs[:3])
    assert ids == sorted([f"{first}#0", f"{first}#1", f"{second}#0", f"{third}#0"])
    assert all(Trajectory.from_json(r).answer in r["golden_answers"] for r in rows)
    rejected = read_jsonl(ref.path / "rejected.jsonl")
    assert [r["id"] for r in rejected] == [qs[3]["id"]] and len(rejected[0]["attempts"]) == 3
    m = ref.manifest["metrics"]
    assert (m["questions"], m["accepted"], m["rejected"], m["attempts"]) == (4, 3, 1, 12)
    assert (m["trajectories"], m["duplicate_trajectories"], m["accepted_attempts"]) == (4, 5, 9)


def test_keep_all_resumes_from_its_journal_after_a_failed_run(runs, monkeypatch):
    """One row per question in the journal (its samples inside): a run that stops in the second batch
    resumes from the first, and the artifact is what one straight run writes."""
    from r3rag.core.artifacts import resolve
    from r3rag.util.errors import UserError

    monkeypatch.setenv("R3RAG_TEST_KEY", "sk-test")
    qs = read_jsonl(resolve("world:latest", "world", runs).path / "train.jsonl")[:4]
    overrides = ["teacher=openai", "model=teacher-model", "api_key_env=R3RAG_TEST_KEY", "attempts=2", "keep=all"]
    overrides += ["temperature=0.3", "limit=4", "batch_size=2", "template=minimal", "doc_style=plain", "name=resumed"]
    failing = {qs[3]["question"]}  # the first run stops at the last question (the endpoint's URL, hashed, stays)
    with ChatServer(reply=WorldTeacher(qs), faults=lambda body: "401" if question_of(body) in failing else None) as srv:
        with pytest.raises(UserError, match="401"):
            run_stage("synthesize", None, [*overrides, f"base_url={srv.url}"], runs)
        journal = next((runs / "synthesize").glob(".journal-resumed-*.jsonl"))
        assert [r["id"] for r in read_jsonl(journal)] == [qs[0]["id"], qs[1]["id"]]
        failing.clear()
        ref = run_stage("synthesize", None, [*overrides, f"base_url={srv.url}"], runs)
    assert not journal.exists()
    rows = read_jsonl(ref.path / "trajectories.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(f"{q['id']}#0" for q in qs)
    m = ref.manifest["metrics"]
    assert (m["resumed_questions"], m["trajectories"], m["duplicate_trajectories"], m["attempts"]) == (2, 4, 4, 8)


def test_keep_all_needs_a_sampling_teacher(runs):
    from r3rag.util.errors import UserError

    with pytest.raises(UserError, match="keep=all"):
        run_stage("synthesize", None, ["keep=all", "name=oracle-all"], runs)
