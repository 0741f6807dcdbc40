"""The rollout loop with scripted generators and real BM25: finish reasons, batching, masks."""

import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.core.protocol import Protocol
from r3rag.generation.hf import _StopOnStrings
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.training.modeling import train_word_tokenizer

DOCS = [
    {"id": "p1", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs ."},
    {"id": "c1", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar ."},
    {"id": "x1", "title": "Korla", "text": "Korla is a city in Dorland ."},
]
P = Protocol(template="minimal", doc_style="plain")


class CountingRetriever:
    def __init__(self):
        self.inner, self.calls = BM25Retriever.build(DOCS), []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return self.inner.search(queries, k)


def _scripts():
    return {
        "good": [
            "<search> Ava Smith works </search>",
            "<think> Ava Smith works for Zentro Labs . </think> <search> Zentro Labs headquartered </search>",
            "<answer> Velmar </answer>",
        ],
        "loops": ["<search> Ava Smith works </search>"] * 10,
        "broken": ["<search> Ava Smith works"],
        "chatty": ["I do not know"],
    }


def _run(cfg, tokenizer=None):
    scripts = _scripts()
    gen = ScriptedGenerator(lambda t: scripts[t.id][t.model_turn_count()], tokenizer)
    examples = [{"id": k, "question": "Where is the company Ava Smith works for ?"} for k in scripts]
    retriever = CountingRetriever()
    return {t.id: t for t in run_rollouts(examples, gen, retriever, P, cfg, tokenizer)}, retriever


def test_finish_reasons_and_one_batched_search_per_turn():
    trajs, retriever = _run(EnvConfig(max_turns=4, top_k=2))
    assert trajs["good"].finish_reason == "answer" and trajs["good"].answer == "Velmar"
    assert trajs["good"].queries == ["Ava Smith works", "Zentro Labs headquartered"]
    assert trajs["good"].retrieved[0][0] == "p1" and trajs["good"].retrieved[1][0] == "c1"
    assert trajs["loops"].finish_reason == "max_turns" and len(trajs["loops"].retrieved) == 3
    assert trajs["broken"].finish_reason == "invalid" and trajs["broken"].steps[0]["reason"] == "unclosed <search>"
    assert trajs["chatty"].finish_reason == "invalid" and trajs["chatty"].steps[0]["reason"].startswith("no <search>")
    # turn 1: good + loops search together; turn 2: good + loops; turn 3: loops only
    assert [len(c) for c in retriever.calls] == [2, 2, 1]


def test_token_budget_ends_with_length():
    tok = train_word_tokenizer([d["text"] for d in DOCS] + ["Where is the company Ava Smith works for ? Question :"])
    trajs, _ = _run(EnvConfig(max_turns=6, top_k=3, max_completion_tokens=20), tok)
    assert trajs["loops"].finish_reason == "length"


def test_mask_marks_model_tokens_only():
    tok = train_word_tokenizer([d["text"] for d in DOCS] + ["Where is the company Ava Smith works for ? Question :"])
    trajs, _ = _run(EnvConfig(max_turns=4, top_k=1), tok)
    t = trajs["good"]
    ids, mask = t.completion()
    assert len(ids) == len(mask) == sum(len(x.ids) for x in t.turns)
    assert t.model_token_count() == sum(mask) < len(mask)  # the documents are not the model's tokens
    env_text = tok.decode([i for i, m in zip(ids, mask) if m == 0])
    model_text = tok.decode([i for i, m in zip(ids, mask) if m == 1])
    assert env_text.startswith("<information>") and "Zentro Labs is headquartered in Velmar" in env_text
    assert "<information>" not in model_text and model_text.endswith("<answer> Velmar </answer>")
    for turn in (x for tr in trajs.values() for x in tr.turns if x.role == "env"):  # batched encoding = one by one
        assert turn.ids == tok.encode(turn.text, add_special_tokens=False)


def test_direct_and_rag_modes_force_an_answer():
    gen = ScriptedGenerator(lambda t: "Velmar </answer>")
    ex = [{"id": "q", "question": "Ava Smith works"}]
    direct = run_rollouts(ex, gen, None, P, EnvConfig(mode="direct"))[0]
    assert direct.answer == "Velmar" and direct.retrieved == []
    rag = run_rollouts(ex, gen, BM25Retriever.build(DOCS), P, EnvConfig(mode="rag", top_k=1))[0]
    assert rag.answer == "Velmar" and rag.retrieved == [["p1"]]
    assert [t.role for t in rag.turns] == ["env", "env", "model"]


def test_reusing_the_kv_cache_between_turns_gives_the_same_rollouts(pipeline_runs):
    """The generator keeps each trajectory's cache between turns; every turn equals a full re-encode.
    Turns are driven by hand (model turn, then documents of varying length) so each continues a cache."""
    from r3rag.core.env import Turn, add_env_turn, new_trajectory
    from r3rag.core.protocol import Protocol
    from r3rag.generation.hf import HFGenerator
    from r3rag.training.modeling import load_policy
    from r3rag.util.jsonl import read_jsonl

    _, refs = pipeline_runs
    model, tok = load_policy(refs["sft"].path)
    proto = Protocol(template="minimal", doc_style="plain")
    questions = read_jsonl(refs["world"].path / "test.jsonl")[:7]
    docs = [d["text"] for d in read_jsonl(refs["world"].path / "corpus.jsonl")[:7]]

    def drive(gen):
        trajs = [new_trajectory(q, proto, tok) for q in questions]
        for turn in range(3):
            active = trajs[turn:]  # a shrinking set, regrouped into batches of 3
            for t, out in zip(active, gen.generate(active, proto.stop_strings(), 6 + turn)):
                t.turns.append(Turn("model", out.text, out.ids))
                add_env_turn(t, " " + " ".join(docs[: 1 + (len(t.turns) + turn) % 3]), tok)
        return [[t.ids for t in tr.turns] for tr in trajs]

    cached_gen = HFGenerator(model, tok, batch_size=3, reuse_cache=True)
    reencoded = drive(HFGenerator(model, tok, batch_size=3, reuse_cache=False))
    assert drive(cached_gen) == reencoded
    assert cached_gen.store.reused_tokens > 0
    static_gen = HFGenerator(model, tok, batch_size=3, static_cache=True)  # the GPU path (compiled there)
    assert static_gen.store is None and drive(static_gen) == reencoded


def test_static_cache_padding_rows_stop_from_their_first_token():
    # the static path pads a call to batch_size rows; sampled padding must not prolong the call
    tok = train_word_tokenizer([d["text"] for d in DOCS] + ["<answer> </answer> Question :"])
    stop = P.stop_strings()
    word, answer_end = tok.encode("Velmar")[0], tok.encode("</answer>")[0]
    ids = torch.tensor([[word, word], [word, answer_end], [word, word], [word, word]])
    assert _StopOnStrings(tok, stop, start=1, n_real=2)(ids, None).tolist() == [False, True, True, True]
    assert _StopOnStrings(tok, stop, start=1)(ids, None).tolist() == [False, True, False, False]


def test_logits_processors_steer_every_step_of_the_hf_generator():
    from r3rag.core.env import new_trajectory
    from r3rag.generation.hf import HFGenerator
    from r3rag.training.modeling import tiny_model

    tok = train_word_tokenizer([d["text"] for d in DOCS] + ["Where is it ? Question :"])
    script = tok.convert_tokens_to_ids(["<answer>", "Velmar", "</answer>"])
    traj = new_trajectory({"id": "q", "question": "Where is it ?"}, P, tok)
    start = len(traj.prompt_ids)

    def force(input_ids, scores):  # the script's next token, whatever the random model prefers
        forced = torch.full_like(scores, float("-inf"))
        forced[:, script[min(input_ids.shape[1] - start, len(script) - 1)]] = 0.0
        return forced

    gen = HFGenerator(tiny_model(tok).eval(), tok, temperature=1.0, logits_processors=[force])
    out = gen.generate([traj], P.stop_strings(), max_new_tokens=10)[0]
    assert out.text == "<answer> Velmar </answer>" and out.finish == "stop"
