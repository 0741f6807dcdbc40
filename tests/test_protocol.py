"""The text protocol: parsing model turns and rendering documents."""

from r3rag.core.protocol import Hit, Protocol

P = Protocol()


def test_search_and_answer_are_parsed():
    s = P.parse_step("<think> need the employer </think> <search>  Ava Smith works </search>")
    assert (s.kind, s.query) == ("search", "Ava Smith works")
    a = P.parse_step("<think> done </think> <answer> Velmar </answer>")
    assert (a.kind, a.answer) == ("answer", "Velmar")


def test_malformed_turns_are_invalid_with_a_reason():
    cases = {
        "<search> Ava Smith works": "unclosed <search>",
        "<search>   </search>": "empty query",
        "<answer> </answer>": "empty answer",
        "<search> a </search> <answer> b </answer>": "more than one action in a turn",
        "I think it is Velmar": "no <search> or <answer> in the turn",
    }
    for text, reason in cases.items():
        step = P.parse_step(text)
        assert step.kind == "invalid" and step.reason == reason, text


def test_render_docs_styles_and_truncation():
    hits = [Hit("d1", 1.0, "Velmar", "Velmar is a city in Dorland ."), Hit("d2", 0.5, "Korla", "Korla is a city .")]
    r1 = Protocol(doc_style="search-r1").render_docs(hits)
    assert (
        r1
        == "\n<information> Doc 1(Title: Velmar) Velmar is a city in Dorland .\nDoc 2(Title: Korla) Korla is a city . </information>\n"
    )
    plain = Protocol(doc_style="plain", max_doc_chars=6).render_docs(hits)
    assert plain == "\n<information> Velmar Korla  </information>\n"


def test_prompt_templates():
    assert Protocol(template="minimal").prompt(" Who? ") == "Question : Who?\n"
    assert Protocol().prompt("Who?").endswith("Question: Who?\n")
    assert "<search> query </search>" in Protocol().prompt("x")


def test_turn_writers_round_trip_through_the_parser():
    assert (
        P.parse_step(P.search_turn("Zentro Labs founded", "Ava works for Zentro Labs .")).query == "Zentro Labs founded"
    )
    assert P.parse_step(P.answer_turn("1987")).answer == "1987"
    assert P.is_well_formed([P.search_turn("q"), P.answer_turn("a")])
    assert not P.is_well_formed([P.search_turn("q")])


R3 = Protocol(name="r3rag")


def test_r3rag_steps_are_parsed_and_written_in_one_format():
    q = R3.search_turn("Who founded Zentro Labs?", "I need the founder.", step=2)
    assert q == (
        "Step 2:\nThe problem analysis: I need the founder.\nThe retrieval query: Who founded Zentro Labs?"
        "\nThe retrieval documents:"
    )
    assert R3.parse_step(q).query == "Who founded Zentro Labs?"
    a = R3.answer_turn("Ava Smith", "Found it.", step=3)
    assert (R3.parse_step(a).kind, R3.parse_step(a).answer) == ("answer", "Ava Smith")
    assert R3.parse_step("Step 1:\nThe retrieval query: where is it? and more\n").query == "where is it?"
    assert R3.is_well_formed([q, a]) and R3.prompt(" Who? ") == "The question: Who?\n"
    assert R3.render_docs([Hit("d", 1.0, "T", "text")]) == " Doc 1(Title: T) text\n"


def test_r3rag_malformed_steps_are_invalid_with_a_reason():
    cases = {
        "Step 1:\nThe problem analysis: hmm": "no 'The retrieval query:' or 'The final answer:' in the step",
        "Step 1:\nThe retrieval query:  \nThe retrieval documents:": "empty query",
        "Step 1:\nThe final answer: ": "empty answer",
        "The retrieval query: a\nThe final answer: b": "more than one action in a step",
    }
    for text, reason in cases.items():
        step = R3.parse_step(text)
        assert step.kind == "invalid" and step.reason == reason, text


def test_close_turn_puts_back_what_an_api_cut():
    assert P.close_turn("<think> x </think> <search> Ava works") == "<think> x </think> <search> Ava works </search>"
    assert P.close_turn("<answer> Velmar") == "<answer> Velmar </answer>"
    assert P.close_turn("<search> a </search>") == "<search> a </search>"
    cut = "Step 1:\nThe problem analysis: x\nThe retrieval query: Ava works\n"
    assert R3.close_turn(cut) == cut.rstrip() + "\nThe retrieval documents:"
    assert R3.close_turn("Step 2:\nThe final answer: Velmar") == "Step 2:\nThe final answer: Velmar"


def test_teacher_messages_for_both_protocols():
    from r3rag.core.env import Trajectory, Turn

    t = Trajectory(
        "1",
        "Who?",
        Protocol(template="minimal").prompt("Who?"),
        turns=[Turn("model", "<search> a </search>"), Turn("env", "\n<information> d </information>\n")],
    )
    msgs = P.teacher_messages(t)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert "<search> query </search>" in msgs[0]["content"]  # the full instruction, whatever the student template
    r = Trajectory("1", "Who?", R3.prompt("Who?"), turns=[Turn("model", R3.search_turn("a")), Turn("env", " d\n")])
    (only,) = R3.teacher_messages(r)
    assert only["content"].endswith("The question: Who?\n" + R3.search_turn("a") + " d\n")
    assert "Step 2:" in only["content"]
