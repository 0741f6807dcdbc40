"""The vLLM adapters against a stand-in `vllm` module (fast, and without vLLM installed): what they
send (token-id prompts, stop strings, sampling settings, the engine's size) and how they read the
results back. tests/test_vllm_real.py runs the same paths on vLLM's CPU build (`make test-vllm`)."""

import importlib.machinery
import json
import sys
import types
from types import SimpleNamespace

import pytest

from r3rag.core.env import Trajectory
from r3rag.training.modeling import train_word_tokenizer

REPLY = "<answer> Velmar </answer>"


class FakeLLM:
    """Stands in for `vllm.LLM`: records what it is given and answers every prompt with `reply` ids."""

    made: list = []

    def __init__(self, model, reply=None, **engine):
        self.model, self.reply, self.calls, self.engine = model, reply, [], engine
        FakeLLM.made.append(self)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        finish = "length" if len(self.reply) >= sampling_params.max_tokens else "stop"
        # vLLM's shape for logprobs=0: per position, {sampled id: Logprob}; here token i has logprob -i/10
        lps = [{t: SimpleNamespace(logprob=-i / 10)} for i, t in enumerate(self.reply)]
        asked = getattr(sampling_params, "logprobs", None) is not None
        return [
            SimpleNamespace(
                outputs=[
                    SimpleNamespace(token_ids=tuple(self.reply), finish_reason=finish, logprobs=lps if asked else None)
                ]
            )
            for _ in prompts
        ]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.LLM, module.SamplingParams = FakeLLM, lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.made = []
    return module


def test_rl_colocate_generator_sends_token_ids_and_reads_back_turns(fake_vllm):
    from r3rag.generation.vllm import VLLMGenerator

    tok = train_word_tokenizer(["Where is it ? Velmar Question :"])
    llm = FakeLLM("policy", reply=tok.encode(REPLY) + [tok.eos_token_id])
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(mode="colocate", llm=llm), processing_class=tok)
    traj = Trajectory(id="q", question="Where is it ?", prompt="Where is it ?", prompt_ids=tok.encode("Where is it ?"))
    out = VLLMGenerator(trainer, temperature=0.7).generate([traj], ("</search>", "</answer>"), 16)[0]
    assert out.text == REPLY and out.finish == "eos" and out.ids == tok.encode(REPLY)  # eos dropped
    prompts, params = llm.calls[0]
    assert prompts == [{"prompt_token_ids": tok.encode("Where is it ?")}]
    assert params.stop == ["</search>", "</answer>"] and params.include_stop_str_in_output
    assert params.temperature == 0.7 and params.max_tokens == 16
    # the sampled ids' logprobs go back to TRL (its importance-sampling correction), the EOS's dropped with it
    assert params.logprobs == 0 and out.logprobs == [-i / 10 for i in range(len(out.ids))]


def test_rl_server_generator_reads_the_sampled_logprobs_back(fake_vllm):
    from r3rag.generation.vllm import VLLMGenerator

    tok = train_word_tokenizer(["Where is it ? Velmar Question :"])
    ids = tok.encode(REPLY)
    sent = {}

    class Client:  # TRL's VLLMClient.generate: logprobs of shape (rows, tokens, 1) when logprobs=0
        def generate(self, **kw):
            sent.update(kw)
            return {"completion_ids": [ids], "logprobs": [[[-0.5 * (i + 1)] for i in range(len(ids))]]}

    trainer = SimpleNamespace(
        vllm_generation=SimpleNamespace(mode="server", vllm_client=Client()), processing_class=tok
    )
    traj = Trajectory(id="q", question="Where is it ?", prompt="Where is it ?", prompt_ids=tok.encode("Where is it ?"))
    out = VLLMGenerator(trainer).generate([traj], ("</search>", "</answer>"), 16)[0]
    assert sent["logprobs"] == 0 and sent["prompts"] == [tok.encode("Where is it ?")]
    assert out.ids == ids and out.logprobs == [-0.5 * (i + 1) for i in range(len(ids))]


def test_eval_vllm_backend_loads_the_policy_weights_into_an_engine(pipeline_runs, fake_vllm, monkeypatch):
    import json

    from r3rag.experiments.pipeline import run_stage
    from r3rag.training.modeling import load_tokenizer
    from r3rag.util.jsonl import read_jsonl

    runs, refs = pipeline_runs
    tok = load_tokenizer(refs["sft"].path / "model")
    first = read_jsonl(refs["world"].path / "test.jsonl")[0]  # every reply is its answer
    reply = tok.encode(f"<answer> {first['golden_answers'][0]} </answer>", add_special_tokens=False)
    init = FakeLLM.__init__
    monkeypatch.setattr(FakeLLM, "__init__", lambda self, model, **kw: init(self, model, reply=reply, **kw))
    pinned = [f"{s}={refs[s].path}" for s in ("world", "index", "sft")]  # other tests add artifacts to runs
    settings = ["systems=[rag,sft]", "rl=", "limit=6", "backend=vllm", "name=vllm", "vllm_kv_cache_gb=2"]
    ref = run_stage("eval", None, [*settings, *pinned], runs)
    (engine,) = FakeLLM.made  # rag and sft run the same weights: one engine
    assert engine.model == str(refs["sft"].path / "model")
    # on the CPU the KV cache is sized in bytes: vLLM reads gpu_memory_utilization as a share of RAM
    assert engine.engine["kv_cache_memory_bytes"] == 2 * 2**30 and "gpu_memory_utilization" not in engine.engine
    assert engine.engine["dtype"] == "float32"  # the CPU: the trainer's fp32, not vLLM's auto (bf16)
    prompts, params = engine.calls[0]
    assert len(prompts) == 6 and all(p["prompt_token_ids"] for p in prompts)
    assert params.temperature == 0.0 and "</answer>" in params.stop
    m = json.loads((ref.path / "metrics.json").read_text())["systems"]["sft"]
    assert m["n"] == 6 and m["searches"] == 0.0 and m["em"] > 0  # the first question is answered right
    preds = [json.loads(line) for line in (ref.path / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 12 and {p["answer"] for p in preds if p["system"] == "sft"} == {first["golden_answers"][0]}


def test_trl_s_colocated_engine_runs_in_fp32_and_eager_on_the_cpu_and_an_asked_dtype_wins(monkeypatch):
    """TRL builds its colocated `vllm.LLM` with no dtype and no eager flag; vLLM's auto would be bf16
    on the CPU, and an inductor compile at every start."""
    pytest.importorskip("trl")
    from trl.generation import vllm_generation

    from r3rag.generation import vllm as vllm_adapter

    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kw: built.append(kw), raising=False)
    vllm_adapter.colocated_engine()
    vllm_generation.LLM(model="policy", seed=0)  # as TRL calls it
    vllm_adapter.colocated_engine("bfloat16")  # set again: wraps TRL's own LLM, not the last wrapper
    vllm_generation.LLM(model="policy")
    vllm_generation.LLM(model="policy", dtype="float16")  # a dtype TRL passes itself stays
    assert [kw.get("dtype") for kw in built] == ["float32", "bfloat16", "float16"]
    assert all(kw["enforce_eager"] for kw in built)  # as the eval engine and serve-vllm on the CPU
    monkeypatch.setattr(vllm_adapter, "on_gpu", lambda: True)
    assert vllm_adapter.engine_dtype() == "auto" and vllm_adapter.engine_dtype("float16") == "float16"
    vllm_adapter.colocated_engine()  # a GPU: vLLM's own dtype and its compiled graphs
    vllm_generation.LLM(model="policy")
    assert built[-1]["dtype"] == "auto" and "enforce_eager" not in built[-1]


def test_eval_vllm_backend_refuses_two_sets_of_weights(pipeline_runs, fake_vllm):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.errors import UserError

    runs, refs = pipeline_runs
    with pytest.raises(UserError, match="one set of weights per eval.*sft, rl"):
        run_stage(
            "eval",
            None,
            [
                "systems=[sft,rl]",
                f"sft={refs['sft'].path}",
                f"rl={refs['rl'].path}",
                "backend=vllm",
                "name=twoweights",
                "limit=2",
            ],
            runs,
        )
    assert FakeLLM.made == []  # refused before loading anything


def test_eval_vllm_backend_without_vllm_is_a_clear_error(pipeline_runs):
    import importlib.util

    from tests.cli_helpers import assert_one_line_error, r3rag

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    runs, _ = pipeline_runs
    out = r3rag(
        "eval",
        "--runs-dir",
        str(runs),
        "--set",
        "systems=[sft]",
        "--set",
        "rl=",
        "--set",
        "limit=2",
        "--set",
        "backend=vllm",
        "--set",
        "name=novllm",
    )
    assert_one_line_error(out, "eval.backend=vllm: vLLM is not installed")


def test_a_trajectory_over_the_engine_s_context_is_one_line_naming_the_setting(fake_vllm):
    from r3rag.generation.vllm import LLMGenerator
    from r3rag.util.errors import UserError

    tok = train_word_tokenizer(["Where is it ? Velmar Question :"])
    llm = FakeLLM("policy", reply=tok.encode(REPLY))
    llm.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=20))
    traj = Trajectory(id="q", question="q", prompt="q", prompt_ids=tok.encode("Where is it ?"))
    gen = LLMGenerator(llm, tok)
    assert gen.generate([traj], ("</answer>",), 20 - len(traj.prompt_ids))[0].text == REPLY  # fits exactly
    with pytest.raises(UserError, match=r"eval.vllm_max_model_len: a trajectory of 4 tokens plus 17 new .* of 20"):
        gen.generate([traj], ("</answer>",), 17)
    assert len(llm.calls) == 1  # refused before sending


def test_an_engine_that_cannot_start_is_one_line(fake_vllm, monkeypatch):
    from r3rag.generation.vllm import load_llm
    from r3rag.util.errors import UserError

    def refuse(self, model, **kw):
        raise RuntimeError("Engine core initialization failed. See root cause above.\nFailed core proc(s): {}")

    monkeypatch.setattr(FakeLLM, "__init__", refuse)
    with pytest.raises(
        UserError, match=r"^vLLM could not start an engine for m: Engine core .* above\. Failed core proc\(s\): \{\}$"
    ):
        load_llm("m")


def test_an_engine_that_dies_mid_eval_is_one_line_and_the_rerun_resumes(pipeline_runs, fake_vllm, monkeypatch):
    from r3rag.experiments.pipeline import run_stage
    from r3rag.util.errors import UserError

    errors = types.ModuleType("vllm.exceptions")

    class VLLMError(Exception):  # vLLM's base class; its EngineDeadError says this when the core is gone
        pass

    errors.VLLMError = VLLMError
    monkeypatch.setitem(sys.modules, "vllm.exceptions", errors)
    runs, refs = pipeline_runs
    calls = []
    generate = FakeLLM.generate

    def dies_on_the_third_call(self, prompts, sampling_params, use_tqdm=True):
        calls.append(len(prompts))
        if len(calls) == 3:
            raise VLLMError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
        return generate(self, prompts, sampling_params, use_tqdm)

    init = FakeLLM.__init__
    monkeypatch.setattr(FakeLLM, "__init__", lambda self, model, **kw: init(self, model, reply=[7, 8], **kw))
    monkeypatch.setattr(FakeLLM, "generate", dies_on_the_third_call)
    pinned = [f"{s}={refs[s].path}" for s in ("world", "index", "sft")]
    settings = ["systems=[sft]", "rl=", "limit=10", "batch_size=1", "max_turns=1", "backend=vllm", "name=dies"]
    with pytest.raises(UserError, match=r"vLLM engine failed mid-run \(EngineCore .*\); .*rerun the same command"):
        run_stage("eval", None, [*settings, *pinned], runs)  # chunks of 4 questions: two done, the third dies
    (journal,) = (runs / "eval").glob(".journal-dies-*.jsonl")
    assert len(journal.read_text().splitlines()) == 2
    monkeypatch.setattr(FakeLLM, "generate", generate)
    FakeLLM.made = []
    ref = run_stage("eval", None, [*settings, *pinned], runs)
    (engine,) = FakeLLM.made
    assert [len(p) for p, _ in engine.calls] == [2]  # only the last two questions were generated again
    assert json.loads((ref.path / "metrics.json").read_text())["systems"]["sft"]["n"] == 10
