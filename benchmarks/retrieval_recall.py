"""Retrieval recall of bm25, dense (all-MiniLM-L6-v2) and hybrid on the HotpotQA dev subsample.

Corpus: the subsample's context pool (shared data, ~4k passages). Prints a Markdown table, then
one line of JSON with the figures (keys like "bm25_recall@5", "dense_answer_recall@5").

Usage:
    python benchmarks/retrieval_recall.py [--limit 400] [--ks 1,5,10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from r3rag.data.corpus import load_corpus
from r3rag.data.shared import shared_data
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.retrieval.dense import DenseRetriever
from r3rag.retrieval.evaluate import retrieval_metrics
from r3rag.retrieval.hybrid import HybridRetriever
from r3rag.util.jsonl import read_jsonl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=0, help="first N questions (0 = all)")
    ap.add_argument("--ks", default="1,3,5,10")
    args = ap.parse_args()
    root = shared_data()
    if root is None:
        sys.exit("shared data not found ($R3RAG_DATA, e.g. ../shared/data, or make data)")
    docs = load_corpus(root / "corpus/hotpotqa_dev_context_pool.jsonl")
    questions = read_jsonl(root / "hotpotqa/dev_distractor_ircot_subsample.jsonl")
    questions = questions[: args.limit] if args.limit else questions
    ks = tuple(int(k) for k in args.ks.split(","))

    t0 = time.time()
    bm25 = BM25Retriever.build(docs)
    dense = DenseRetriever.build(docs)
    build_s = time.time() - t0
    hybrid = HybridRetriever(bm25, dense, docs, {"backend": "hybrid", "rrf_k": 60, "candidates": 20})
    results = {
        name: retrieval_metrics(r, questions, ks) for name, r in (("bm25", bm25), ("dense", dense), ("hybrid", hybrid))
    }

    n = results["bm25"]
    print(
        f"HotpotQA dev subsample: {n['n']} questions ({n['n_gold']} with gold passages), "
        f"{len(docs)} passages; indexes built in {build_s:.0f}s\n"
    )
    cols = [f"recall@{k}" for k in ks] + [f"answer_recall@{k}" for k in ks]
    print("| backend | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, m in results.items():
        print(f"| {name} | " + " | ".join(f"{m[c]:.3f}" for c in cols) + " |")
    print(json.dumps({f"{name}_{c}": round(m[c], 4) for name, m in results.items() for c in cols}))


if __name__ == "__main__":
    main()
