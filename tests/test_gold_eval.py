from r3rag.experiments.pipeline import run_stage
from r3rag.util.jsonl import read_jsonl
from tests.test_readers import TINY_SFT, _reader_data, runs  # noqa: F401


def test_gold_reader_evaluates_with_its_gold_documents(runs):
    from r3rag.core.artifacts import resolve

    data = _reader_data(runs, "gold")
    sft = run_stage("sft", None, TINY_SFT + [f"data={data.path}", "name=gold"], runs)
    ev = run_stage(
        "eval", None, [f"sft={sft.path}", "rl=", "systems=[gold]", "limit=8", "max_new_tokens=8", "index="], runs
    )
    preds = read_jsonl(ev.path / "predictions.jsonl")
    test = {q["id"]: q for q in read_jsonl(resolve("world:latest", "world", runs).path / "test.jsonl")}
    assert len(preds) == 8 and all(p["system"] == "gold" and p["searches"] == 1 for p in preds)
    for p in preds:
        assert sorted(d["id"] for d in p["retrieved_docs"][0]) == sorted(test[p["id"]]["metadata"]["supporting_docs"])
        assert p["gold_doc_recall"] == 1.0
