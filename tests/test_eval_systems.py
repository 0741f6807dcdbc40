"""`r3rag eval` systems beyond the built-ins: a transformers model path, an OpenAI-compatible endpoint
policy, an LLM judge, sampling with several draws; and chat-template prompts."""

import json

from r3rag.core.protocol import Protocol
from r3rag.experiments.pipeline import run_stage
from r3rag.util.jsonl import read_jsonl
from tests.chat_server import ChatServer

COMMON = ["limit=6", "max_turns=3", "max_new_tokens=16", "rl="]


def _eval(runs, *overrides):
    ref = run_stage("eval", None, [*COMMON, *overrides], runs)
    return json.loads((ref.path / "metrics.json").read_text()), read_jsonl(ref.path / "predictions.jsonl"), ref


def test_any_transformers_model_path_is_a_system(pipeline_runs):
    runs, refs = pipeline_runs
    model_dir = refs["sft"].path / "model"  # a plain transformers directory (config, weights, tokenizer)
    metrics, preds, ref = _eval(
        runs,
        "systems=[plain]",
        f"models.plain.model={model_dir}",
        "models.plain.template=minimal",
        "models.plain.doc_style=plain",
        "name=hfpath",
    )
    m = metrics["systems"]["plain"]
    assert m["n"] == 6 and m["tokens"] > 0 and m["questions_per_s"] > 0
    assert all(p["turns"] and p["tokens"] for p in preds)
    # the same weights as the sft policy, prompted the same way: the same answers as the built-in sft system
    sft_metrics, sft_preds, _ = _eval(runs, "systems=[sft]", "name=sftonly")
    assert [p["answer"] for p in preds] == [p["answer"] for p in sft_preds]


def test_static_cache_decoding_gives_the_same_answers(pipeline_runs):
    runs, _ = pipeline_runs
    _, dynamic, _ = _eval(runs, "systems=[sft]", "name=sftonly")
    _, static, ref = _eval(runs, "systems=[sft]", "static_cache=true", "name=static")
    assert [p["answer"] for p in static] == [p["answer"] for p in dynamic]
    assert [p["tokens"] for p in static] == [p["tokens"] for p in dynamic]
    assert ref.manifest["config"]["static_cache"] is True


def test_endpoint_policy_and_llm_judge(pipeline_runs):
    runs, _ = pipeline_runs

    def policy(body):
        if len(body["messages"]) == 1:
            return "<search> " + body["messages"][0]["content"].split("Question :")[-1].strip()
        return "<answer> Nowhere"

    with ChatServer(reply=policy) as pol, ChatServer(reply=lambda b: "Final answer: True") as jud:
        metrics, preds, ref = _eval(
            runs,
            "systems=[api]",
            f"models.api.endpoint={pol.url}",
            "models.api.model=m",
            "models.api.template=minimal",
            "models.api.doc_style=plain",
            f"judge.endpoint={jud.url}",
            "judge.model=j",
            "name=api",
        )
        judge_calls = len(jud.requests)
    m = metrics["systems"]["api"]
    assert m["n"] == 6 and m["searches"] == 1.0 and m["em"] == 0.0
    assert m["judge_acc"] == 1.0 and judge_calls == 6  # the judge overrules EM (here, always "True")
    assert all(p["answer"] == "Nowhere" and p["judge"] is True for p in preds)
    assert len(pol.requests) == 12  # a search turn and an answer turn per question
    assert ref.manifest["config"]["models"]["api"]["endpoint"] == pol.url


def test_sampling_several_draws(pipeline_runs):
    runs, _ = pipeline_runs
    metrics, preds, _ = _eval(runs, "systems=[sft]", "temperature=1.0", "n_samples=3", "name=sampled")
    m = metrics["systems"]["sft"]
    assert m["samples"] == 3 and m["n"] == 6 and len(preds) == 18
    assert sorted({p["sample"] for p in preds}) == [0, 1, 2]
    assert m["em_any"] >= m["em"]
    by_q = {}
    for p in preds:
        by_q.setdefault(p["id"], []).append(p["em"])
    assert m["em"] == round(sum(sum(v) / 3 for v in by_q.values()) / 6, 4)


def test_chat_template_wraps_the_prompt():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return f"<|user|>{messages[0]['content']}<|assistant|>"

    proto = Protocol(template="minimal", chat=True)
    assert proto.context_prompt("Why?", Tok()) == "<|user|>Question : Why?\n<|assistant|>"
    assert Protocol(template="minimal").context_prompt("Why?", Tok()) == "Question : Why?\n"  # chat off


def test_backend_auto_takes_vllm_where_installed_and_the_eval_repays_its_start(monkeypatch):
    """eval.backend=auto: vLLM when it is installed, the eval has AUTO_VLLM_QUESTIONS questions or
    more and its model systems share one set of weights (one engine); transformers otherwise."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    from r3rag.stages.eval import AUTO_VLLM_QUESTIONS, Config, resolve_backend, system_specs

    find_spec = importlib.util.find_spec
    installed = {"vllm": True}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (object() if installed["vllm"] else None) if name == "vllm" else find_spec(name, *a),
    )
    policies = {"sft": SimpleNamespace(path=Path("/runs/sft/a")), "rl": SimpleNamespace(path=Path("/runs/rl/b"))}
    one = Config(systems=["rl"], backend="auto")
    assert resolve_backend(one, system_specs(one), policies, AUTO_VLLM_QUESTIONS) == "vllm"
    assert resolve_backend(one, system_specs(one), policies, AUTO_VLLM_QUESTIONS - 1) == "transformers"
    two = Config(systems=["sft", "rl"], backend="auto")  # two sets of weights: one engine cannot hold both
    assert resolve_backend(two, system_specs(two), policies, 1000) == "transformers"
    named = Config(systems=["rl"], backend="transformers")
    assert resolve_backend(named, system_specs(named), policies, 1000) == "transformers"
    installed["vllm"] = False
    assert resolve_backend(one, system_specs(one), policies, 1000) == "transformers"
