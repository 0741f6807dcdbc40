"""A prebuilt FlashRAG / Search-R1 dense index loads as it is. The index here is built the way FlashRAG's
index builder builds `e5_Flat.index` (its pooling re-implemented in this file, MiniLM standing in for
e5-base-v2: "passage: " + contents, masked mean pooling, L2 norm, index_factory "Flat" inner product),
then searched through r3rag with the E5 query settings; and the ways it can fail, one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from r3rag.core.artifacts import list_artifacts
from r3rag.experiments.pipeline import run_stage
from r3rag.retrieval import load_retriever
from r3rag.retrieval.dense import resolve_encoder
from r3rag.retrieval.prebuilt import open_prebuilt
from r3rag.util.errors import UserError
from tests.test_retrieval import TOPICS

faiss = pytest.importorskip("faiss")

PASSAGES = [
    *TOPICS,  # tests/test_retrieval.py's six, and more
    ("Glacier", "A glacier is a persistent body of dense ice that moves slowly under its own weight."),
    ("Chess", "Chess is a board game for two players, each commanding sixteen pieces."),
] + [
    (f"Town {i}", f"Town {i} is a market town on the river {i % 5} with {1000 + 37 * i} inhabitants.")
    for i in range(32)
]
QUERIES = ["how do green plants make food from light", "a fiddle", "which drug did Fleming find", "moving ice"]


def flashrag_embed(texts: list[str], prefix: str, max_length: int) -> np.ndarray:
    """FlashRAG's encoder, written out: prefix, masked mean pooling, L2 normalisation, float32."""
    from transformers import AutoModel, AutoTokenizer

    path = resolve_encoder("")
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    inputs = tok([prefix + t for t in texts], max_length=max_length, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        last = model(**inputs, return_dict=True).last_hidden_state
    mask = inputs["attention_mask"]
    emb = last.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
    return torch.nn.functional.normalize(emb, dim=-1).numpy().astype(np.float32)


def write_corpus(path, rows) -> None:
    with open(path, "w") as f:
        for i, (title, text) in enumerate(rows):
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n")


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    d = tmp_path_factory.mktemp("flashrag")
    write_corpus(d / "wiki-18.jsonl", PASSAGES)
    contents = [json.loads(line)["contents"] for line in open(d / "wiki-18.jsonl")]
    emb = flashrag_embed(contents, "passage: ", 180)
    index = faiss.index_factory(emb.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(emb)
    faiss.write_index(index, str(d / "e5_Flat.index"))
    q = flashrag_embed(QUERIES, "query: ", 256)  # what Search-R1's retrieval server would search with
    scores, ids = index.search(q, 3)
    return d / "e5_Flat.index", d / "wiki-18.jsonl", scores, ids


def test_prebuilt_index_searches_as_flashrag_does(prebuilt, tmp_path):
    index_path, corpus, scores, ids = prebuilt
    r = open_prebuilt(index_path, corpus, tmp_path / "docs")  # E5 query settings by default
    assert r.settings["query_prefix"] == "query: " and r.settings["index_type"] == "flat"
    hits = r.search(QUERIES, 3)
    assert [[h.doc_id for h in hs] for hs in hits] == [[str(i) for i in row] for row in ids]
    assert np.allclose([[h.score for h in hs] for hs in hits], scores, atol=1e-4)
    assert (hits[0][0].title, hits[1][0].title) == ("Photosynthesis", "Violin")  # contents' quoted title line
    plain = open_prebuilt(index_path, corpus, tmp_path / "docs", query_prefix="")
    assert not np.allclose([[h.score for h in hs] for hs in plain.search(QUERIES, 3)], scores, atol=1e-4)


def test_prebuilt_index_as_an_index_artifact(prebuilt, tmp_path):
    index_path, corpus, _, ids = prebuilt
    runs = tmp_path / "runs"
    args = ["backend=dense", f"prebuilt_index={index_path}", "world=", f"corpus={corpus}", 'query_prefix="query: "']
    ref = run_stage("index", None, args, runs)
    assert not (ref.path / "index" / "faiss.index").exists()  # used where it lies, not copied
    hits = load_retriever(ref.path / "index").search(QUERIES, 3)
    assert [[h.doc_id for h in hs] for hs in hits] == [[str(i) for i in row] for row in ids]


def _stage_fails(tmp_path, index_path, corpus, match: str) -> None:
    runs = tmp_path / "runs"
    args = ["backend=dense", f"prebuilt_index={index_path}", "world=", f"corpus={corpus}", 'query_prefix="query: "']
    with pytest.raises(UserError, match=match):
        run_stage("index", None, args, runs)
    assert list_artifacts(runs, "index") == [] and not list(runs.glob("index/.tmp-*"))  # nothing half-written


def test_prebuilt_index_of_another_encoder_is_one_line(prebuilt, tmp_path):
    _, corpus, _, _ = prebuilt
    other = faiss.IndexFlatIP(768)  # e5-base-v2's size, searched with a 384-dimensional encoder
    other.add(np.random.default_rng(0).normal(size=(len(PASSAGES), 768)).astype(np.float32))
    faiss.write_index(other, str(tmp_path / "e5.index"))
    _stage_fails(tmp_path, tmp_path / "e5.index", corpus, "holds 768-dimensional vectors but the encoder makes 384")


def test_prebuilt_corpus_of_another_length_is_one_line(prebuilt, tmp_path):
    index_path, _, _, _ = prebuilt
    write_corpus(tmp_path / "longer.jsonl", PASSAGES + [("Extra", "one passage the index never saw")])
    _stage_fails(tmp_path, index_path, tmp_path / "longer.jsonl", f"holds {len(PASSAGES)} vectors but the corpus has")


def test_truncated_prebuilt_index_is_one_line(prebuilt, tmp_path):
    index_path, corpus, _, _ = prebuilt
    (tmp_path / "cut.index").write_bytes(index_path.read_bytes()[:-1000])
    _stage_fails(tmp_path, tmp_path / "cut.index", corpus, r"cut\.index: not a readable faiss index")


def test_a_replaced_prebuilt_file_is_caught_at_load(prebuilt, tmp_path):
    index_path, corpus, _, _ = prebuilt
    mine = tmp_path / "e5_Flat.index"
    mine.write_bytes(index_path.read_bytes())
    args = ["backend=dense", f"prebuilt_index={mine}", "world=", f"corpus={corpus}", 'query_prefix="query: "']
    ref = run_stage("index", None, args, tmp_path / "runs")
    other = faiss.IndexFlatIP(384)
    other.add(np.zeros((3, 384), dtype=np.float32))
    faiss.write_index(other, str(mine))
    with pytest.raises(UserError, match="the prebuilt index was replaced"):
        load_retriever(ref.path / "index")
