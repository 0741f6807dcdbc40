"""Oracle teacher acceptance on real data, per retriever: how often following the gold chain
through the retriever actually finds every gold passage.

Data (shared, via `r3rag import`'s converter): HotpotQA dev subsample (400, over its ~4k-passage
context pool) and MuSiQue train sample (100, over its ~2k-passage pool). Retrievers: bm25, dense
(all-MiniLM-L6-v2) and hybrid (RRF). The oracle searches the question, then the gold titles
(HotpotQA) or the decomposed sub-questions with earlier answers filled in (MuSiQue); a question is
accepted when every gold passage came back with grounded queries. Prints a Markdown table, then
one line of JSON (keys like "hotpotqa_bm25_top3").

Usage:
    python benchmarks/oracle_acceptance.py [--ks 3,5] [--protocol r3rag]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

from r3rag.core.protocol import Protocol
from r3rag.data.corpus import load_corpus
from r3rag.data.importers import import_questions
from r3rag.data.shared import shared_data
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.retrieval.dense import DenseRetriever
from r3rag.retrieval.hybrid import HybridRetriever
from r3rag.stages.synthesize import Config, attempt_loop
from r3rag.synthesis.teachers import oracle_teacher

SETS = {
    "hotpotqa": ("hotpotqa/dev_distractor_ircot_subsample.jsonl", "corpus/hotpotqa_dev_context_pool.jsonl"),
    "musique": ("musique/train_hipporag_sample.jsonl", "corpus/musique_context_pool.jsonl"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="3,5")
    ap.add_argument("--protocol", default="search-r1")
    args = ap.parse_args()
    root = shared_data()
    if root is None:
        sys.exit("shared data not found ($R3RAG_DATA, e.g. ../shared/data, or make data)")
    protocol = Protocol(name=args.protocol)
    out, rows = {}, []
    for name, (qfile, cfile) in SETS.items():
        questions, _ = import_questions(root / qfile)
        docs = load_corpus(root / cfile)
        bm25, dense = BM25Retriever.build(docs), DenseRetriever.build(docs)
        hybrid = HybridRetriever(bm25, dense, docs, {"backend": "hybrid", "rrf_k": 60, "candidates": 20})
        for rname, retriever in (("bm25", bm25), ("dense", dense), ("hybrid", hybrid)):
            for k in (int(x) for x in args.ks.split(",")):
                t0 = time.time()
                done = list(attempt_loop(questions, oracle_teacher(protocol), retriever, protocol, Config(top_k=k)))
                rate = sum(r["status"] == "accepted" for r in done) / len(done)
                reasons = Counter(r["reject_reason"].split(":")[0] for r in done if r["status"] == "rejected")
                out[f"{name}_{rname}_top{k}"] = round(rate, 4)
                rows.append((name, len(done), len(docs), rname, k, rate, dict(reasons), time.time() - t0))
    print("| data | questions | passages | retriever | top-k | accepted | rejections |")
    print("|---|---:|---:|---|---:|---:|---|")
    for name, n, nd, rname, k, rate, reasons, _ in rows:
        why = ", ".join(f"{k2} {v}" for k2, v in sorted(reasons.items()))
        print(f"| {name} | {n} | {nd} | {rname} | {k} | {rate:.3f} | {why} |")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
