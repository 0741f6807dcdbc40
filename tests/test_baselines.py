"""Prompted baselines for `r3rag eval`: the `qa` reader (closed-book, single-shot RAG with its
documents in the prompt), the IRCoT loop, per-system top_k, spec validation, by-dataset metrics.
Scripted generators and an in-process BM25: offline, seconds."""

import json
from types import SimpleNamespace

import pytest

from r3rag.core.env import EnvConfig, Generated, run_rollouts
from r3rag.core.protocol import Hit, Protocol
from r3rag.evaluation.predictions import summarize, to_prediction
from r3rag.evaluation.systems import SystemSpec, check_spec
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.util.errors import UserError

DOCS = [
    {"id": "p1", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs ."},
    {"id": "c1", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Paris ."},
    {"id": "x1", "title": "Korla", "text": "Korla is a city in Dorland ."},
    {"id": "x2", "title": "Dorland", "text": "Dorland is a country ."},
    {"id": "x3", "title": "Velmar", "text": "Velmar is a city in Dorland ."},
    {"id": "x4", "title": "Brin", "text": "Brin is a river in Korla ."},
]
QUESTION = "Where is the company Ava Smith works for headquartered ?"
EX = [{"id": "q1", "question": QUESTION}]
QA = Protocol(template="qa")
IRCOT = Protocol(name="ircot", doc_style="plain")


class CountingRetriever:
    def __init__(self):
        self.inner, self.calls = BM25Retriever.build(DOCS), []

    def search(self, queries, k):
        self.calls.append((list(queries), k))
        return self.inner.search(queries, k)


def _doc_count(text: str) -> int:
    return sum(f"Doc {i}(Title:" in text for i in range(1, len(DOCS) + 1))


def test_qa_closed_book_prompt_has_no_documents_and_the_answer_is_parsed():
    prompt = QA.prompt(QUESTION)
    assert prompt.startswith("Answer the question with a short phrase (a name, date, number or yes/no) inside <answer>")
    assert prompt.endswith(f"Question: {QUESTION}\n") and "Doc 1" not in prompt
    gen = ScriptedGenerator(lambda t: "Paris </answer> and more")
    traj = run_rollouts(EX, gen, None, QA, EnvConfig(mode="direct"))[0]
    assert (traj.answer, traj.finish_reason, traj.retrieved) == ("Paris", "answer", [])
    assert [t.text for t in traj.turns] == ["<answer> ", "Paris </answer>"]  # prefilled, stopped at </answer>


class FixedGenerator:
    """Fixed turns with a given finish (ScriptedGenerator cannot end a turn with "eos")."""

    def __init__(self, text, finish):
        self.text, self.finish = text, finish

    def generate(self, contexts, stop, max_new_tokens):
        return [Generated(self.text, None, self.finish) for _ in contexts]


@pytest.mark.parametrize(
    "text,finish,answer,kept,reason",
    [
        ("Paris\n\nThe answer is Paris.", "length", "Paris", "Paris\n", "answer"),  # the first line, the rest cut
        ("\nParis\nmore", "stop", "Paris", "\nParis\n", "answer"),  # a newline before the answer is skipped
        ("Paris", "eos", "Paris", "Paris", "answer"),  # the model ended its turn: the open answer counts
        ("The arena seats about", "length", None, "The arena seats about", "length"),  # cut mid-line: no answer
    ],
)
def test_qa_answer_left_open_is_its_first_complete_line(text, finish, answer, kept, reason):
    traj = run_rollouts(EX, FixedGenerator(text, finish), None, QA, EnvConfig(mode="direct"))[0]
    assert (traj.answer, traj.turns[-1].text, traj.finish_reason) == (answer, kept, reason)


def test_qa_chat_prompt_wraps_the_documents_in_the_user_message():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return (
                "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
                + "<|im_start|>assistant\n"
            )

    hits = [Hit("p1", 2.0, "Ava Smith", "Ava Smith works for Zentro Labs .")]
    chat = Protocol(template="qa", chat=True).context_prompt(QUESTION, Tok(), docs=hits)
    user = chat.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    assert "Doc 1(Title: Ava Smith) Ava Smith works" in user and user.index("Doc 1") < user.index("Question:")
    # no tokenizer, or chat off: the plain prompt, documents included
    assert Protocol(template="qa", chat=True).context_prompt(QUESTION, None, docs=hits) == QA.prompt(QUESTION, hits)
    assert QA.context_prompt(QUESTION, Tok(), docs=hits) == QA.prompt(QUESTION, hits)
    assert QA.context_prompt(QUESTION) == QA.prompt(QUESTION)
    with pytest.raises(ValueError):  # other templates put documents in env turns
        Protocol(template="minimal").prompt(QUESTION, hits)
    plain = Protocol(template="qa", doc_style="plain", max_doc_chars=9).prompt(QUESTION, hits)
    assert "Documents:\nAva Smith\n" in plain and "Title:" not in plain


@pytest.mark.parametrize("top_k", [3, 5])
def test_qa_rag_puts_top_k_documents_in_the_prompt_as_one_search(top_k):
    retriever = CountingRetriever()
    gen = ScriptedGenerator(lambda t: "Paris </answer>")
    traj = run_rollouts(EX, gen, retriever, QA, EnvConfig(mode="rag", top_k=top_k))[0]
    assert retriever.calls == [([QUESTION], top_k)]  # one search, with the question
    assert _doc_count(traj.prompt) == top_k and traj.prompt.index("Doc 1") < traj.prompt.index("Question:")
    assert len(traj.retrieved) == 1 and len(traj.retrieved[0]) == top_k and traj.retrieved[0][0] == "p1"
    assert [d["id"] for d in traj.documents[0]] == traj.retrieved[0]
    assert [t.role for t in traj.turns] == ["env", "model"] and traj.turns[0].text == "<answer> "  # no documents turn
    assert traj.answer == "Paris"
    row = to_prediction(
        "rag",
        traj,
        {"id": "q1", "question": QUESTION, "golden_answers": ["Paris"], "metadata": {"supporting_docs": ["p1", "c1"]}},
    )
    assert row["searches"] == 1 and row["gold_doc_recall"] == 1.0 and row["em"] == 1.0


def test_other_templates_keep_the_documents_turn_in_rag_mode():
    gen = ScriptedGenerator(lambda t: "Paris </answer>")
    traj = run_rollouts(
        EX, gen, BM25Retriever.build(DOCS), Protocol(template="minimal"), EnvConfig(mode="rag", top_k=2)
    )[0]
    assert traj.prompt == f"Question : {QUESTION}\n" and [t.role for t in traj.turns] == ["env", "env", "model"]


def test_ircot_retrieves_with_the_question_then_with_each_sentence():
    sentences = [
        "Ava Smith works for Zentro Labs. Then she",
        "Zentro Labs is headquartered in Paris\n",
        "So the answer is: Paris. Done",
    ]
    retriever = CountingRetriever()
    gen = ScriptedGenerator(lambda t: sentences[t.model_turn_count()])
    traj = run_rollouts(EX, gen, retriever, IRCOT, EnvConfig(max_turns=6, top_k=2))[0]
    assert [q for q, _ in retriever.calls] == [
        [QUESTION],
        ["Ava Smith works for Zentro Labs."],
        ["Zentro Labs is headquartered in Paris"],
    ]
    assert traj.finish_reason == "answer" and traj.answer == "Paris"
    assert len(traj.retrieved) == 3 and traj.retrieved[0][0] == "p1" and traj.retrieved[2][0] == "c1"
    assert [t.role for t in traj.turns] == ["env", "model", "env", "model", "env", "model"]
    # one sentence per turn: the overhang after ". " is cut off
    assert [t.text for t in traj.turns if t.role == "model"] == [
        "Ava Smith works for Zentro Labs.",
        "Zentro Labs is headquartered in Paris\n",
        "So the answer is: Paris.",
    ]
    assert traj.turns[0].text.startswith("\n<information> Ava Smith works")
    assert "one sentence at a time" in traj.prompt and "So the answer is: <short answer>." in traj.prompt


def test_ircot_stops_at_max_turns_and_parses_sentences():
    gen = ScriptedGenerator(lambda t: "I need more facts about Ava Smith. ")
    traj = run_rollouts(EX, gen, BM25Retriever.build(DOCS), IRCOT, EnvConfig(max_turns=3, top_k=1))[0]
    assert traj.finish_reason == "max_turns" and traj.answer is None
    assert traj.model_turn_count() == 3 and len(traj.retrieved) == 3  # the question, then two sentences
    assert IRCOT.stop_strings() == (". ", ".\n")
    for text, answer in {
        "So the answer is: Paris.": "Paris",
        "Thus the answer is 1912": "1912",
        "So the Answer is: yes.\n": "yes",
        "So the answer is: So the answer is: Oslo.": "Oslo",
    }.items():
        step = IRCOT.parse_step(text)
        assert (step.kind, step.answer) == ("answer", answer)
    assert IRCOT.parse_step("   \n").reason == "empty sentence"
    assert IRCOT.parse_step("So the answer is: .").reason == "empty answer"
    assert IRCOT.parse_step(" Korla is in Dorland.").query == "Korla is in Dorland."


def test_ircot_sentence_ended_by_eos_still_retrieves():
    class EosGenerator:  # a chat model that ends its message after each sentence
        def generate(self, contexts, stop, max_new_tokens):
            return [
                Generated(
                    "So the answer is: Paris" if t.model_turn_count() else "Ava works for Zentro Labs", None, "eos"
                )
                for t in contexts
            ]

    traj = run_rollouts(EX, EosGenerator(), BM25Retriever.build(DOCS), IRCOT, EnvConfig(max_turns=4, top_k=1))[0]
    assert traj.queries == ["Ava works for Zentro Labs"] and len(traj.retrieved) == 2
    assert (traj.answer, traj.finish_reason) == ("Paris", "answer")


def test_ircot_trims_the_ids_of_the_sentence_too():
    from r3rag.training.modeling import train_word_tokenizer

    tok = train_word_tokenizer([d["text"] for d in DOCS] + [QUESTION, "So the answer is : Paris . Then"])
    gen = ScriptedGenerator(
        lambda t: "Zentro Labs is in Paris . Then more" if t.model_turn_count() == 0 else "So the answer is : Paris",
        tok,
    )
    traj = run_rollouts(
        EX, gen, BM25Retriever.build(DOCS), Protocol(name="ircot"), EnvConfig(max_turns=3, top_k=1), tok
    )[0]
    first = traj.turns[1]
    assert first.text == "Zentro Labs is in Paris ." and tok.decode(first.ids) == first.text
    assert traj.answer == "Paris"


def test_misspelled_choices_are_one_line_user_errors():
    for key, bad, allowed in (
        ("template", "qaa", "search-r1, minimal, qa"),
        ("protocol", "ircott", "search-r1, r3rag, ircot"),
        ("doc_style", "fancy", "search-r1, plain"),
        ("mode", "ragg", "iterative, direct, rag"),
    ):
        with pytest.raises(UserError) as e:
            check_spec("x", SystemSpec(model="m", **{key: bad}))
        msg = str(e.value)
        assert "\n" not in msg and f"eval.models.x.{key}" in msg and bad in msg and allowed in msg
    with pytest.raises(UserError, match="ircot runs in mode iterative"):
        check_spec("x", SystemSpec(model="m", protocol="ircot", mode="rag"))
    check_spec("x", SystemSpec(model="m", protocol="ircot"))
    check_spec("x", SystemSpec(model="m", template="qa", mode="rag", top_k=5))


def test_misspelled_template_in_an_eval_config_is_one_line(tmp_path):
    from r3rag.experiments.pipeline import run_stage

    with pytest.raises(UserError) as e:
        run_stage("eval", None, ["systems=[cb]", "models.cb.model=some/model", "models.cb.template=qaa"], tmp_path)
    assert "\n" not in str(e.value) and "models.cb.template" in str(e.value) and "qa" in str(e.value)


def test_per_system_top_k_reaches_the_rollouts(world_index_runs):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.jsonl import read_jsonl

    ref = run_stage(
        "eval",
        None,
        [
            "limit=4",
            "rl=",
            "sft=",
            "systems=[tt2,tt5]",
            "models.tt2.scripted=top-title",
            "models.tt5.scripted=top-title",
            "models.tt5.top_k=5",
            "top_k=2",
        ],
        world_index_runs,
    )
    rows = read_jsonl(ref.path / "predictions.jsonl")
    depth = {r["system"]: {len(step) for step in r["retrieved_docs"]} for r in rows}
    assert depth == {"tt2": {2}, "tt5": {5}}
    assert set(json.loads((ref.path / "metrics.json").read_text())["systems"]) == {"tt2", "tt5"}


def test_by_dataset_breaks_down_em_f1_cover_with_intervals():
    def row(qid, dataset, answer, gold):
        traj = SimpleNamespace(answer=answer, finish_reason="answer", retrieved=[], documents=[], turns=[])
        q = {"id": qid, "question": "?", "golden_answers": [gold], "metadata": {"dataset": dataset} if dataset else {}}
        return to_prediction("s", traj, q)

    rows = [
        row("h1", "hotpotqa", "Paris", "Paris"),
        row("h2", "hotpotqa", "Rome", "Paris"),
        row("w1", "2wikimultihopqa", "the city of Oslo", "Oslo"),
        row("n1", None, "x", "x"),
    ]
    assert [r["dataset"] for r in rows] == ["hotpotqa", "hotpotqa", "2wikimultihopqa", None]
    by = summarize(rows)["by_dataset"]
    assert set(by) == {"hotpotqa", "2wikimultihopqa"}  # rows without a dataset are left out
    assert (
        by["hotpotqa"]["n"] == 2 and by["hotpotqa"]["em"] == 0.5 and by["hotpotqa"]["em_ci"] == (0.0126, 0.9874)
    )  # exact: 1 of 2
    wiki = by["2wikimultihopqa"]
    assert wiki["em"] == 0.0 and wiki["cover"] == 1.0 and 0 < wiki["f1"] < 1
    assert {"em", "f1", "cover", "em_ci", "f1_ci", "cover_ci", "n"} <= set(wiki)
