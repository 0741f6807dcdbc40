"""The text protocol: parsing model turns and rendering documents."""

from r3rag.protocol import Hit, Protocol

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
    assert r1 == "\n<information> Doc 1(Title: Velmar) Velmar is a city in Dorland .\nDoc 2(Title: Korla) Korla is a city . </information>\n"
    plain = Protocol(doc_style="plain", max_doc_chars=6).render_docs(hits)
    assert plain == "\n<information> Velmar Korla  </information>\n"


def test_prompt_templates():
    assert Protocol(template="minimal").prompt(" Who? ") == "Question : Who?\n"
    assert Protocol().prompt("Who?").endswith("Question: Who?\n")
    assert "<search> query </search>" in Protocol().prompt("x")


def test_turn_writers_round_trip_through_the_parser():
    assert P.parse_step(P.search_turn("Zentro Labs founded", "Ava works for Zentro Labs .")).query == "Zentro Labs founded"
    assert P.parse_step(P.answer_turn("1987")).answer == "1987"
    assert P.is_well_formed([P.search_turn("q"), P.answer_turn("a")])
    assert not P.is_well_formed([P.search_turn("q")])
