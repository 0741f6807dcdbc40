"""An OpenAI-compatible endpoint as the policy (ChatGenerator) and the LLM answer judge, against a real loopback server."""

import pytest

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.core.protocol import Hit, Protocol
from r3rag.evaluation.judge import AnswerJudge, JudgeError, parse_verdict
from r3rag.generation.openai_chat import ChatGenerator, EndpointError
from r3rag.generation.openai_client import ChatClient
from tests.chat_server import ChatServer, first_n, last_user_text


class OneDocRetriever:
    def __init__(self):
        self.queries = []

    def search(self, queries, k):
        self.queries += queries
        return [[Hit("d1", 3.0, "Paris", "Paris is the capital of France.")] for _ in queries]


def search_then_answer(body):
    """Like a server honouring `stop`: the closing tag is not in the reply."""
    if len(body["messages"]) == 1:  # only the prompt so far
        return "<think> I need the capital. </think> <search> capital of France"
    return "<think> The document says Paris. </think> <answer> Paris"


def test_endpoint_policy_runs_the_protocol_as_a_conversation():
    proto = Protocol()
    retriever = OneDocRetriever()
    with ChatServer(reply=search_then_answer) as srv, ChatClient(srv.url, "m", max_retries=0) as client:
        gen = ChatGenerator(client, proto, temperature=0.0, seed=3)
        [traj] = run_rollouts(
            [{"id": "q1", "question": "What is the capital of France?"}],
            gen,
            retriever,
            proto,
            EnvConfig(mode="iterative", max_turns=4),
        )
        bodies = srv.bodies()
    assert traj.answer == "Paris" and traj.finish_reason == "answer"
    assert retriever.queries == ["capital of France"]
    assert [m["role"] for m in bodies[1]["messages"]] == ["user", "assistant", "user"]
    assert bodies[1]["messages"][1]["content"].endswith("</search>")  # the dropped stop string is put back
    assert "Paris is the capital of France." in bodies[1]["messages"][2]["content"]
    assert bodies[0]["stop"] == ["</search>", "</answer>"] and bodies[0]["seed"] == 3
    assert gen.completion_tokens > 0


def test_endpoint_policy_in_rag_mode_answers_after_the_prefill():
    proto = Protocol()
    with ChatServer(reply=lambda body: "<answer> Paris") as srv, ChatClient(srv.url, "m", max_retries=0) as client:
        [traj] = run_rollouts(
            [{"id": "q1", "question": "Capital of France?"}],
            ChatGenerator(client, proto),
            OneDocRetriever(),
            proto,
            EnvConfig(mode="rag", max_turns=1),
        )
        last = srv.bodies()[0]["messages"][-1]
    assert traj.answer == "Paris"
    assert last["role"] == "user" and last["content"].rstrip().endswith("<answer>")


def test_a_failed_request_stops_with_the_endpoint_named():
    proto = Protocol()
    with ChatServer(faults=lambda body: "400") as srv, ChatClient(srv.url, "m", max_retries=0) as client:
        with pytest.raises(EndpointError, match=r"endpoint http://127\.0\.0\.1:\d+/v1/chat/completions: question q1"):
            run_rollouts(
                [{"id": "q1", "question": "?"}], ChatGenerator(client, proto), OneDocRetriever(), proto, EnvConfig()
            )


def test_close_turn_puts_back_the_dropped_stop_string():
    close_open_tag = Protocol().close_turn
    assert close_open_tag("<search> a b") == "<search> a b </search>"
    assert close_open_tag("<search> a </search> then <answer> x") == "<search> a </search> then <answer> x </answer>"
    assert close_open_tag("<answer> x </answer>") == "<answer> x </answer>"
    assert close_open_tag("no tags") == "no tags"


def test_parse_verdict():
    assert parse_verdict("Same city.\nFinal answer: True")
    assert parse_verdict("final answer: **true**")
    assert not parse_verdict("Final answer: False")
    assert not parse_verdict("Final answer: uncertain")
    assert not parse_verdict("Final answer: True ... on reflection\nFinal answer: False")  # the last verdict wins


def test_judge_calls_only_when_exact_match_fails():
    def reply(body):
        return "It is the same person.\nFinal answer: True" if "JFK" in last_user_text(body) else "Final answer: False"

    items = [
        ("Who?", ["John F. Kennedy"], "the John F Kennedy"),  # EM after normalisation: no call
        ("Who?", ["John F. Kennedy"], "JFK"),
        ("Who?", ["John F. Kennedy"], "Nixon"),
        ("Who?", ["John F. Kennedy"], None),
    ]
    with ChatServer(reply=reply) as srv, ChatClient(srv.url, "judge", max_retries=0) as client:
        judge = AnswerJudge(client)
        assert judge.judge_many(items) == [True, True, False, False]
        assert judge.calls == 2 and len(srv.requests) == 2
        assert all(r["body"]["temperature"] == 0.0 for r in srv.requests)


def test_judge_failure_is_an_error_not_a_zero():
    with (
        ChatServer(faults=first_n(["500", "500"])) as srv,
        ChatClient(srv.url, "judge", max_retries=1, backoff=0.01) as client,
    ):
        with pytest.raises(JudgeError, match="judge endpoint .*http_500"):
            AnswerJudge(client).judge_many([("Who?", ["A"], "B")])
