"""A scripted chat-API teacher for synthetic-world questions (tests and benchmarks).

Replies like a good teacher that follows each question's gold chain, in either protocol, the
way an API does (stop strings left out). Plug it into `tests.chat_server.ChatServer`.

Usage:
    with ChatServer(reply=WorldTeacher(questions, protocol="r3rag", wrong={"q7"})) as srv: ...
"""

from r3rag.core.protocol import Protocol


def question_of(body) -> str:
    content = body["messages"][0]["content"]
    if "The question: " in content:  # r3rag: one message with the whole context
        return content.split("The question: ")[-1].split("\n")[0]
    return content.split("Question: ")[-1].strip()


class WorldTeacher:
    """Replies like a good teacher following each question's gold chain, as an API would (stop
    strings left out). `wrong_greedy` answer wrongly at temperature 0, `wrong` always, `alias`
    answer "<gold> city" (not an exact match); judge requests get `judge_says`."""

    def __init__(self, questions, protocol="search-r1", wrong_greedy=(), wrong=(), alias=(), judge_says=True):
        self.by_text = {q["question"]: q for q in questions}
        self.proto = Protocol(name=protocol)
        self.wrong_greedy, self.wrong, self.alias, self.judge_says = (
            set(wrong_greedy),
            set(wrong),
            set(alias),
            judge_says,
        )

    def __call__(self, body):
        if body["messages"][0]["content"].startswith("You are checking an answer"):  # r3rag.evaluation.judge
            return f"It names the same place.\nFinal answer: {self.judge_says}"
        q = self.by_text[question_of(body)]
        if self.proto.r3:
            hop = body["messages"][0]["content"].count("The retrieval documents:")
        else:
            hop = sum(m["role"] == "assistant" for m in body["messages"])
        chain = q["metadata"]["chain"]
        if hop < len(chain):
            text = self.proto.search_turn(chain[hop]["query"], chain[hop - 1]["fact"] if hop else None, hop + 1)
            for stop in body.get("stop", []):
                text = text.split(stop)[0]
            return text
        answer = q["golden_answers"][0]
        if q["id"] in self.wrong or (q["id"] in self.wrong_greedy and body["temperature"] == 0):
            answer = "Nowhere"
        elif q["id"] in self.alias:
            answer += " city"
        return self.proto.answer_turn(answer, chain[-1]["fact"], hop + 1)
